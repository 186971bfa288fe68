"""norm_fn's four kernels lower for ascend, cuda and cpu.

Ascend: persistent work tiles over the 64 cores (``block_idx`` and a wave loop), every input and
output moved by DMA, the compute in SIMD regions of real vector code (no SIMT region, no scalar UB
access in a SIMD region, no barrier inside a thread-guarded branch), the ascend flavor's RMS scale
as the vector multiply, add, square root and division. CUDA: the sources compile with nvcc for an
explicit arch. cpu: the RMS scale's product and sum stay two roundings (no ``fmaf``; the build
forbids implicit contraction), the backward's dot product is the one fused multiply-add per term.
"""

from __future__ import annotations

import re

import pytest

from vmi_core.ascend_sim import UB_BYTES
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_mhc.kernels.norm_fn import (
    MAX_MIX,
    MergeSpec,
    ReduceSpec,
    build_merge_bwd,
    build_merge_fwd,
    build_reduce_bwd,
    build_reduce_fwd,
)

MERGE = MergeSpec(24)
# The reduce specialisations test_norm_fn runs on ascend-sim and cpu (their lowering is shared);
# the merge kernels' Ascend lowering runs under slow, with their ascend-sim test.
REDUCE_ASCEND = ReduceSpec(24, 4 * 1280, 1e-6, "ascend")
REDUCE_CUDA = ReduceSpec(24, 4 * 1280, 1e-6, "cuda")


def _ascend_common(src: str, name: str, simd: int, dma: tuple[int, int]) -> None:
    assert f"__global__ __vector__ void {name}" in src
    assert "block_idx" in src
    assert_vector_regions(src, simd=simd, simt=0)
    assert dma_counts(src) == dma


@pytest.mark.slow
def test_ascend_merge_kernels():
    # Forward: fn, normw in; out_fn out. Backward: fn, normw, out_fn_grad, fn_grad, normw_grad in;
    # fn_grad, normw_grad out. One SIMD region each.
    _ascend_common(build_merge_fwd.source(MERGE, "ascend"), "fn_normw_merge_fwd_kernel", 1, (2, 1))
    src = build_merge_bwd.source(MERGE, "ascend")
    _ascend_common(src, "fn_normw_merge_bwd_kernel", 1, (5, 2))
    assert "vmula" in src


def test_ascend_reduce_kernels():
    # Forward: per split the partial products and square sums in; out_mul, sqrsum, out out; SIMD
    # regions: zeroing, the split sum, the RMS scale. Backward: g, out_mul, sqrsum in; the two
    # gradients out; one SIMD region.
    src = build_reduce_fwd.source(REDUCE_ASCEND, "ascend")
    _ascend_common(src, "reduce_partials_and_rmsnorm_fwd_kernel", 3, (2, 3))
    for op in ("vmuls", "vsqrt", "vdiv", "vgather2", "vscatter"):
        assert op in src, op
    src = build_reduce_bwd.source(REDUCE_ASCEND, "ascend")
    _ascend_common(src, "reduce_partials_and_rmsnorm_bwd_kernel", 1, (3, 2))
    assert "vmula" in src and src.count("vdiv") == 3


@pytest.mark.slow
def test_largest_tiles_fit_the_unified_buffer():
    for build, spec in ((build_merge_fwd, MergeSpec(MAX_MIX)), (build_merge_bwd, MergeSpec(MAX_MIX)),
                        (build_reduce_fwd, ReduceSpec(MAX_MIX, 4 * 7168, 1e-6, "ascend"))):
        assert build.ascend_lowering(spec).ub_bytes <= UB_BYTES


def test_cpu_rms_scale_is_not_contracted():
    # The ascend flavor's f32(f32(sq · f32(1/K)) + eps): a product, then a sum, separately rounded.
    src = build_reduce_fwd.source(REDUCE_ASCEND, "cpu")
    assert "fmaf" not in src
    assert re.search(r"(\w+)\[0\] = \(\w+\[0\] \* ", src)
    assert "sqrtf" in src
    assert len(re.findall(r"= fmaf\(", build_reduce_bwd.source(REDUCE_ASCEND, "cpu"))) == 1


@pytest.mark.cuda_compile
def test_cuda_reduce_kernels_compile():
    src = build_reduce_bwd.source(REDUCE_CUDA, "cuda")
    assert_cuda_compiles(src, "reduce_partials_and_rmsnorm_bwd_kernel")


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("source,spec", [(build_merge_fwd.source, MERGE), (build_merge_bwd.source, MERGE),
                                         (build_reduce_fwd.source, REDUCE_CUDA)],
                         ids=["merge_fwd", "merge_bwd", "reduce_fwd"])
def test_cuda_kernels_compile_more(source, spec):
    check_cuda_source(source(spec, "cuda"))
