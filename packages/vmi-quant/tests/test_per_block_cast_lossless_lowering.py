"""per_block_cast_lossless lowers for ascend and cuda.

Ascend: the generated AscendC loads the FP4 tile by DMA, runs one SIMT region (exponents) and
one SIMD region (rescale) per work tile (the README's "differences by target" entry) and stores
the E4M3 tile by DMA.
CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.targets import get_flavor
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cases.pbcl_cases import COVERING, CUDA_LOWERING, LOWERING, SF_MODES, case_id
from vmi_devkit.cuda import nvcc_compile_or_skip
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
    assert "__global__ __vector__ void per_block_cast_lossless_kernel" in src
    # Exponent gathers and scatters in one SIMT region, the rescale in one SIMD region.
    assert_vector_regions(src, simd=1, simt=1)
    assert dma_counts(src) == (1, 1)
    assert "block_idx" in src


@pytest.mark.parametrize("case", LOWERING, ids=case_id)
def test_ascend_lowering(case):
    _check_ascend(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in COVERING if c not in LOWERING], ids=case_id)
def test_ascend_lowering_all(case):
    _check_ascend(case)


def _check_cuda(case):
    src = build_per_block_cast_lossless.source(_spec(*case), "cuda")
    assert "__global__ void" in src and "per_block_cast_lossless_kernel" in src
    nvcc_compile_or_skip(src)


@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", CUDA_LOWERING, ids=case_id)
def test_cuda_lowering_compiles(case):
    _check_cuda(case)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", [c for c in COVERING if c not in CUDA_LOWERING], ids=case_id)
def test_cuda_lowering_compiles_all(case):
    _check_cuda(case)
