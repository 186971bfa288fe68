"""per_block_cast_lossless lowers for ascend and cuda.

Ascend: the generated AscendC loads the FP4 tile by DMA, runs one SIMT region (exponents) and
one SIMD region (rescale) per work tile (the README's "differences by target" entry) and stores
the E4M3 tile by DMA.
CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

from vmi_core.targets import get_flavor
from vmi_devkit.cases.pbcl_cases import COVERING, CUDA_LOWERING, LOWERING, SF_MODES, case_id
from vmi_devkit.lowering import assert_ascend_kernel, assert_cuda_compiles, case_table_tests
from vmi_quant.kernels.per_block_cast_lossless import build_per_block_cast_lossless
from vmi_quant.ops.per_block_cast_lossless import make_spec
from vmi_quant.sf_layout import SFLayout


def _layout(flavor, sf_mode, block_k):
    col_major, _, packed = SF_MODES[sf_mode]
    return SFLayout.of(get_flavor(flavor), packed=packed, col_major=col_major, block_k=block_k)


def _spec(x_block, x_mode, out_block, out_mode, flavor):
    return make_spec(_layout(flavor, x_mode, x_block[1]), x_block, _layout(flavor, out_mode, out_block[1]), out_block)


def _check_ascend(case):
    src = build_per_block_cast_lossless.source(_spec(*case), "ascend")
    # Exponent gathers and scatters in one SIMT region, the rescale in one SIMD region.
    assert_ascend_kernel(src, "per_block_cast_lossless_kernel", simd=1, simt=1, dma=(1, 1))


def _check_cuda(case):
    assert_cuda_compiles(build_per_block_cast_lossless.source(_spec(*case), "cuda"), "per_block_cast_lossless_kernel")


(test_ascend_lowering, test_ascend_lowering_all,
 test_cuda_lowering_compiles, test_cuda_lowering_compiles_all) = case_table_tests(
    _check_ascend, _check_cuda, covering=COVERING, lowering=LOWERING, cuda_lowering=CUDA_LOWERING, ids=case_id,
    cuda_slow=False)
