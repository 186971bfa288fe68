"""cast and cast_back lower for ascend and cuda.

Ascend: the default run lowers the casts and the cast_back cases ascend-sim runs by default
(test_cast's ``SIM_CASES``, a same-format cast among them, and ``SIM_CAST_BACK_COVERING``, both
cast_back vector-region kinds below), the slow run every other cast and cast_back configuration.
The generated AscendC moves each work tile with one DMA in and one DMA out and has exactly the
vector regions the README's "differences by target" table lists: a cast has one SIMD region per
work tile, a cast_back one SIMT region for the SF gather and, for E4M3 data with power-of-two block
widths, one SIMD region; a same-format cast has no vector region at all (DMA in, DMA out). CUDA:
the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cases.cast_cases import (
    CAST_BACK_COVERING,
    CAST_BACK_FULL,
    CAST_SPECS,
    SIM_CAST_BACK_COVERING,
    case_id,
    cast_back_spec,
)
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_quant.kernels.cast import CastSpec, build_cast
from vmi_quant.kernels.cast_back import build_cast_back


def _cast_id(spec: CastSpec) -> str:
    return f"{spec.in_fmt}-{spec.out_fmt}" + ("-sr" if spec.stochastic else "")


# The default run lowers the casts the default ascend-sim test compiles (test_cast's SIM_CASES; the
# lowering is cached on disk, so they cost the default run nothing more): every pair but the fp32 and
# bf16 copies, and stochastic rounding from bf16. The other four (those copies, stochastic rounding from
# fp32) have the regions and DMA of the E4M3 copy and of bf16 -> E4M3 SR: they lower in the slow run,
# where ascend-sim runs them.
SIM_SLOW_CASTS = {CastSpec("fp32", "fp32"), CastSpec("bf16", "bf16"), CastSpec("fp32", "bf16", True),
                  CastSpec("fp32", "e4m3", True)}
ASCEND_CAST = [pytest.param(spec, id=_cast_id(spec), marks=[pytest.mark.slow] if spec in SIM_SLOW_CASTS else [])
               for spec in CAST_SPECS]


@pytest.mark.parametrize("spec", ASCEND_CAST)
def test_cast_ascend_lowering(spec):
    src = build_cast.source(spec, "ascend")
    assert "__global__ __vector__ void cast_kernel" in src
    # Same format: DMA in, DMA out, nothing to compute. Otherwise one SIMD region (README table).
    assert_vector_regions(src, simd=0 if spec.copy_only else 1, simt=0)
    assert dma_counts(src) == (1, 1), "one DMA in and one DMA out per work tile"
    assert "block_idx" in src, "persistent scheduling over the vector cores"


def cast_back_regions(spec) -> dict:
    """The SF gather in one SIMT region; the dequantization in one SIMD region for E4M3 data whose
    blocks are power-of-two lane groups of the 128-column tile, else in the SIMT region."""
    bk = spec.block_k
    lane_groups = (128 % bk == 0 or bk % 128 == 0) and (min(bk, 128) & (min(bk, 128) - 1)) == 0
    return dict(simd=1 if lane_groups and spec.in_fmt == "e4m3" else 0, simt=1)


# The default run lowers the cases the default ascend-sim test compiles (the lowering is cached on
# disk, so they cost the default run nothing more); the rest of the covering set lowers in the slow
# run, the cuda-flavor cases too (the ascend target always runs the ascend flavor).
ASCEND_CAST_BACK = ([pytest.param(case, id=case_id(case)) for case in SIM_CAST_BACK_COVERING]
                    + [pytest.param(case, id=case_id(case), marks=pytest.mark.slow)
                       for case in CAST_BACK_COVERING if case not in SIM_CAST_BACK_COVERING])


def test_default_cast_back_lowerings_have_both_region_kinds():
    # One case with the SIMD dequantization (E4M3 data, power-of-two block), one without.
    assert {cast_back_regions(cast_back_spec(*case))["simd"] for case in SIM_CAST_BACK_COVERING} == {0, 1}


@pytest.mark.parametrize("case", ASCEND_CAST_BACK)
def test_cast_back_ascend_lowering(case):
    spec = cast_back_spec(*case)
    src = build_cast_back.source(spec, "ascend")
    assert "__global__ __vector__ void cast_back_kernel" in src
    assert_vector_regions(src, **cast_back_regions(spec))
    assert dma_counts(src) == (1, 1), "one DMA in and one DMA out per work tile"
    assert "block_idx" in src, "persistent scheduling over the vector cores"


# The flavor of an unpacked SF changes only runtime strides: one lowering per distinct kernel; and the
# ascend target always runs the ascend flavor, so cuda-flavor packed words (int32) are not lowered for it.
COVERING_SPECS = {cast_back_spec(*case) for case in CAST_BACK_COVERING + SIM_CAST_BACK_COVERING}
FULL_SPECS = [spec for spec in dict.fromkeys(cast_back_spec(*case) for case in CAST_BACK_FULL if case[5] == "ascend")
              if spec not in COVERING_SPECS]


@pytest.mark.slow
@pytest.mark.parametrize("spec", FULL_SPECS, ids=lambda s: case_id((s.in_fmt, s.out_fmt, s.sf_layout.kind,
                                                                    s.sf_layout.pack, s.sf_layout.col_major,
                                                                    (s.block_m, s.block_k))))
def test_cast_back_ascend_lowering_full(spec):
    assert_vector_regions(build_cast_back.source(spec, "ascend"), **cast_back_regions(spec))


CUDA_CAST = [CastSpec("fp32", "e4m3", True), CastSpec("e4m3", "bf16"), CastSpec("bf16", "bf16")]
CUDA_CAST_BACK = [CAST_BACK_COVERING[i] for i in (1, 2, 10)]
CUDA_SOURCES = ([(_cast_id(s), lambda s=s: build_cast.source(s, "cuda"), "cast_kernel") for s in CUDA_CAST]
                + [(case_id(c), lambda c=c: build_cast_back.source(cast_back_spec(*c), "cuda"), "cast_back_kernel")
                   for c in CUDA_CAST_BACK])


@pytest.mark.cuda_compile
@pytest.mark.parametrize("name,source,kernel", CUDA_SOURCES, ids=[n for n, _, _ in CUDA_SOURCES])
def test_cuda_lowering_compiles(name, source, kernel):
    src = source()
    assert_cuda_compiles(src, kernel)


ALL_CUDA = ([(_cast_id(s), lambda s=s: build_cast.source(s, "cuda")) for s in CAST_SPECS]
            + [(case_id(c), lambda c=c: build_cast_back.source(cast_back_spec(*c), "cuda"))
               for c in CAST_BACK_COVERING])


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("name,source", ALL_CUDA, ids=[n for n, _ in ALL_CUDA])
def test_cuda_lowering_compiles_all(name, source):
    src = source()
    check_cuda_source(src)
