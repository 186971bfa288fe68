"""per_token_cast_and_cast_back lowers for ascend and cuda.

Ascend: the generated AscendC loads the tile by DMA, runs one SIMD region per work tile
(real vector instructions, no scalar UB access; no SIMT region) and stores the tile back by
DMA. CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cases.ptccb_cases import COVERING, CUDA_LOWERING, LOWERING, SF_MODES
from vmi_devkit.cuda import nvcc_compile_or_skip
from vmi_quant.kernels.per_token_cast_and_cast_back import build_per_token_cast_and_cast_back
from vmi_quant.ops.per_token_cast_and_cast_back import make_spec


def _spec(in_dtype, fmt, npc, sf_mode):
    return make_spec(in_dtype, fmt, npc, *SF_MODES[sf_mode])


def _check_ascend(case):
    src = build_per_token_cast_and_cast_back.source(_spec(*case), "ascend")
    assert "__global__ __vector__ void per_token_cast_and_cast_back_kernel" in src
    assert_vector_regions(src, simd=1, simt=0)
    # One tile in, the same tile back out, in place.
    assert dma_counts(src) == (1, 1)
    assert "block_idx" in src


@pytest.mark.parametrize("case", LOWERING, ids=lambda c: "-".join(map(str, c)))
def test_ascend_lowering(case):
    _check_ascend(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in COVERING if c not in LOWERING], ids=lambda c: "-".join(map(str, c)))
def test_ascend_lowering_full(case):
    _check_ascend(case)


def _check_cuda(case):
    src = build_per_token_cast_and_cast_back.source(_spec(*case), "cuda")
    assert "__global__ void" in src and "per_token_cast_and_cast_back_kernel" in src
    nvcc_compile_or_skip(src)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", CUDA_LOWERING, ids=lambda c: "-".join(map(str, c)))
def test_cuda_lowering_compiles(case):
    _check_cuda(case)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", [c for c in COVERING if c not in CUDA_LOWERING], ids=lambda c: "-".join(map(str, c)))
def test_cuda_lowering_compiles_all(case):
    _check_cuda(case)
