"""swiglu_forward lowers for ascend and cuda.

Ascend: the generated AscendC loads the gate and up slices of a row by DMA, runs per work tile SIMD
regions (real vector instructions: the negated gate; the SwiGLU math with the vector division, the
E4M3 amax, scales and codes, the clamp-counter row sums) around a SIMT region of the gate's exps
(vmi's correctly rounded exp: no hardware transcendental), a SIMT region that scatters the SF at
computed addresses (E4M3) and one that stores the worker's counters (the README's "differences
by target" entry), no barrier inside a thread-guarded branch, and stores the output slice by DMA.
CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import re

from vmi_core.targets import get_flavor
from vmi_core.tools.source_checks import transcendental_calls
from vmi_devkit.cases.swiglu_forward_cases import COVERING, CUDA_LOWERING, LOWERING, SF_MODES, case_id
from vmi_devkit.lowering import assert_ascend_kernel, assert_cuda_compiles, case_table_tests
from vmi_quant.kernels.swiglu_forward import build_swiglu_forward
from vmi_quant.ops.swiglu_forward import make_spec
from vmi_quant.sf_layout import SFLayout


def _spec(in_dtype, fmt, npc, sf_mode, with_psum, weights, clamp, count, flavor):
    flavor = get_flavor(flavor)
    layout, round_sf = None, False
    if fmt == "e4m3":
        col_major, round_sf, packed = SF_MODES[sf_mode]
        layout = SFLayout.of(flavor, packed=packed, col_major=col_major)
    return make_spec(in_dtype, fmt, npc, layout, round_sf, with_psum=with_psum, with_weights=weights != "none",
                     with_scaling_factor=weights == "w+rsf", with_clamp=clamp is not None, count_clamped=count,
                     flavor=flavor)


def _check_ascend(case):
    spec = _spec(*case)
    src = build_swiglu_forward.source(spec, "ascend")
    quantized = spec.fmt == "e4m3"
    # In: the gate and up slices. Out: the output slice (the SF goes out from SIMT). SIMD: the negated
    # gate, the activation; SIMT: its exps (Shell.exp: vmi's correctly rounded exp).
    regions = assert_ascend_kernel(src, "swiglu_forward_kernel", simd=2,
                                   simt=1 + int(quantized) + int(spec.count_clamped), dma=(2, 1), block_idx=False)
    assert regions
    assert "simd_inst::vdiv" in src and "vmi_exp(" in src and transcendental_calls(src) == []
    if spec.with_psum:
        # The expert search reads the psum layout from global memory in scalar code.
        assert re.search(r"PSUM\[", src)


def _check_cuda(case):
    assert_cuda_compiles(build_swiglu_forward.source(_spec(*case), "cuda"), "swiglu_forward_kernel")


(test_ascend_lowering, test_ascend_lowering_full,
 test_cuda_lowering_compiles, test_cuda_lowering_compiles_all) = case_table_tests(
    _check_ascend, _check_cuda, covering=COVERING, lowering=LOWERING, cuda_lowering=CUDA_LOWERING, ids=case_id,
    cuda_slow=False)
