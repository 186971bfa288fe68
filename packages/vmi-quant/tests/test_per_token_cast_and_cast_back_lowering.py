"""per_token_cast_and_cast_back lowers for ascend and cuda.

Ascend: the generated AscendC loads the tile by DMA, runs one SIMD region per work tile
(real vector instructions, no scalar UB access; no SIMT region) and stores the tile back by
DMA. CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

from vmi_devkit.cases.ptccb_cases import COVERING, CUDA_LOWERING, LOWERING, SF_MODES
from vmi_devkit.lowering import assert_ascend_kernel, assert_cuda_compiles, case_table_tests
from vmi_quant.kernels.per_token_cast_and_cast_back import build_per_token_cast_and_cast_back
from vmi_quant.ops.per_token_cast_and_cast_back import make_spec
from vmi_quant.options import SFOptions


def _spec(in_dtype, fmt, npc, sf_mode):
    round_sf, use_e4m3_sf = SF_MODES[sf_mode]
    return make_spec(in_dtype, fmt, npc, SFOptions(round_sf=round_sf, use_e4m3_sf=use_e4m3_sf))


def _case_id(case) -> str:
    return "-".join(map(str, case))


def _check_ascend(case):
    src = build_per_token_cast_and_cast_back.source(_spec(*case), "ascend")
    # One tile in, the same tile back out, in place.
    assert_ascend_kernel(src, "per_token_cast_and_cast_back_kernel", simd=1, simt=0, dma=(1, 1))


def _check_cuda(case):
    src = build_per_token_cast_and_cast_back.source(_spec(*case), "cuda")
    assert_cuda_compiles(src, "per_token_cast_and_cast_back_kernel")


(test_ascend_lowering, test_ascend_lowering_full,
 test_cuda_lowering_compiles, test_cuda_lowering_compiles_all) = case_table_tests(
    _check_ascend, _check_cuda, covering=COVERING, lowering=LOWERING, cuda_lowering=CUDA_LOWERING, ids=_case_id,
    cuda_slow=True)
