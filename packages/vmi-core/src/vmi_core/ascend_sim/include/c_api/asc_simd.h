// vmi ascend-sim: stands in for CANN's "c_api/asc_simd.h", the C API TileLang's
// <tl_templates/ascend/simd_inst.h> is written against, so that header compiles
// unmodified on top of the model.
#pragma once

#include "vmi_ascend_sim/simd.h"
#include "vmi_ascend_sim/simd_cvt.h"
