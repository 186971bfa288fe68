"""per_block_cast lowers for ascend and cuda.

Ascend: the generated AscendC loads the tile by DMA, runs one SIMD region per work tile (real
vector instructions, no scalar UB access) and one SIMT region for the SF at computed addresses
(the README's "differences by target" entry), and stores the data tile by DMA (none in sf-only
mode). CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.targets import get_flavor
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cases.pbc_cases import COVERING, CUDA_LOWERING, LOWERING, SF_MODES, case_id
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_quant.kernels.per_block_cast import build_per_block_cast
from vmi_quant.ops.per_block_cast import make_spec
from vmi_quant.sf_layout import SFLayout


def _spec(in_dtype, fmt, block, sf_mode, col_major, flavor, mode="cast"):
    round_sf, packed = SF_MODES[sf_mode]
    layout = SFLayout.of(get_flavor(flavor), packed=packed, col_major=col_major, block_k=block[1])
    return make_spec(in_dtype, fmt, block, mode, layout, round_sf)


def _check_ascend(spec):
    src = build_per_block_cast.source(spec, "ascend")
    assert "__global__ __vector__ void per_block_cast_kernel" in src
    assert_vector_regions(src, simd=1, simt=1)
    assert dma_counts(src) == (1, 0 if spec.mode == "sf_only" else 1)
    assert "block_idx" in src


MODE_CASES = [
    ("sf-only", _spec("bf16", "e4m3", (128, 32), "packed", True, "ascend", mode="sf_only")),
    ("cast-only", _spec("bf16", "e4m3", (32, 128), "fp32", False, "ascend", mode="cast_only")),
]
# No default ascend-sim test runs these modes: the default run lowers sf-only (no data DMA out), the
# slow run cast-only too.
MODE_PARAMS = [pytest.param(name, spec, id=name, marks=[pytest.mark.slow] if name == "cast-only" else [])
               for name, spec in MODE_CASES]


@pytest.mark.parametrize("case", LOWERING, ids=case_id)
def test_ascend_lowering(case):
    _check_ascend(_spec(*case))


@pytest.mark.parametrize("name,spec", MODE_PARAMS)
def test_ascend_lowering_modes(name, spec):
    _check_ascend(spec)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in COVERING if c not in LOWERING], ids=case_id)
def test_ascend_lowering_full(case):
    _check_ascend(_spec(*case))


def _check_cuda(spec):
    src = build_per_block_cast.source(spec, "cuda")
    assert_cuda_compiles(src, "per_block_cast_kernel")


CUDA_CASES = [(case_id(c), _spec(*c)) for c in CUDA_LOWERING] + [MODE_CASES[0]]


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("name,spec", CUDA_CASES, ids=[n for n, _ in CUDA_CASES])
def test_cuda_lowering_compiles(name, spec):
    _check_cuda(spec)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", [c for c in COVERING if c not in CUDA_LOWERING], ids=case_id)
def test_cuda_lowering_compiles_all(case):
    _check_cuda(_spec(*case))
