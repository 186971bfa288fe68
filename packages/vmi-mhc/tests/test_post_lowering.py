"""mhc_post_fwd / mhc_post_bwd lower for ascend and cuda.

Ascend, forward: persistent ``(token, hidden tile)`` items over the 64 cores (``block_idx``),
``post``, ``comb``, ``x`` and the residual tile loaded by DMA, the output tile stored by DMA, one
SIMD region of real vector code (broadcast loads of the mixes, fused multiply-adds). Backward:
persistent tokens, a serial hidden-tile loop with DMA of ``x``, the residual and ``d_o`` in and
``d_x``, ``d_residual`` out per tile, and of ``post``, ``comb`` in and ``d_post``, ``d_comb`` out per
token; three SIMD regions (zeroing of the partial sums, the tile pass, the folds), no SIMT region,
no barrier inside a thread-guarded branch; the largest tiles fit the unified buffer. CUDA: both
sources compile with nvcc for an explicit arch (under ``slow``), with no barrier in a
thread-guarded branch.
"""

from __future__ import annotations

import pytest

from vmi_core.ascend_sim import UB_BYTES
from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_devkit.cuda import check_cuda_source
from vmi_mhc.kernels.post import PostBackwardSpec, PostForwardSpec, build_post_bwd, build_post_fwd

# The default specs are those test_post runs on ascend-sim (their lowering is shared).
HIDDEN = 2600


def _check_forward(spec):
    src = build_post_fwd.source(spec, "ascend")
    assert "__global__ __vector__ void post_fwd_kernel" in src
    assert "block_idx" in src
    # assert_vector_regions also fails on scalar UB accesses in a SIMD region and on a barrier
    # inside a thread-guarded branch.
    assert_vector_regions(src, simd=1, simt=0)
    assert "vlds_brc" in src and "vmula" in src
    assert dma_counts(src) == (4, 1)


def _check_backward(spec):
    src = build_post_bwd.source(spec, "ascend")
    assert "__global__ __vector__ void post_bwd_kernel" in src
    assert "block_idx" in src
    assert_vector_regions(src, simd=3, simt=0)
    assert "vlds_brc" in src and "vmula" in src
    assert dma_counts(src) == (5, 4)


def test_ascend_forward():
    _check_forward(PostForwardSpec(4, HIDDEN))


def test_ascend_backward():
    _check_backward(PostBackwardSpec(4, HIDDEN))


@pytest.mark.slow
@pytest.mark.parametrize("spec", [PostForwardSpec(4, 8192), PostForwardSpec(8, 8192), PostForwardSpec(1, 96)],
                         ids=str)
def test_ascend_forward_more(spec):
    _check_forward(spec)
    lowering = build_post_fwd.ascend_lowering(spec)
    assert lowering.ub_bytes <= UB_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("hidden", (96, 7168, 8192))
def test_ascend_backward_more(hidden):
    spec = PostBackwardSpec(4, hidden)
    _check_backward(spec)
    lowering = build_post_bwd.ascend_lowering(spec)
    assert lowering.ub_bytes <= UB_BYTES


def _check_cuda(name, src):
    assert "__global__ void" in src and name in src
    assert barriers_in_thread_guards(src) == 0
    check_cuda_source(src)


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_backward_compiles():
    _check_cuda("post_bwd_kernel", build_post_bwd.source(PostBackwardSpec(4, HIDDEN), "cuda"))


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_forward_compiles():
    _check_cuda("post_fwd_kernel", build_post_fwd.source(PostForwardSpec(4, HIDDEN), "cuda"))
