"""pre_apply_mix's two kernels lower for ascend and cuda.

Ascend forward: persistent (token, hidden tile) work items over the 64 cores, DMA of the token's
weights and streams in and of the result out, the stream mix as real vector code in one SIMD
region (the weights gathered into the lanes, the fused multiply-adds as ``vmula``). Ascend
backward: persistent tokens, DMA of o_grad, x, x_grad and the weights in and of x_grad and mix_grad
out, one SIMD region (the fixed-order row sums and the in-place x_grad update), a tile set that
fits the unified buffer at the largest hidden size. Neither has a SIMT region, a scalar UB access in
a SIMD region or a barrier inside a thread-guarded branch. CUDA: the sources compile with nvcc, and
the backward's shared memory at the largest hidden size fits a block. The default specialisations
are those test_pre_apply_mix runs on ascend-sim (their lowering is shared): the backward by default,
the forward under slow, so the forward's lowering here is the default run's only Ascend check of
that kernel.
"""

from __future__ import annotations

import pytest

from vmi_core.ascend_sim import UB_BYTES
from vmi_core.compile import CUDA_SHARED_LIMIT
from vmi_core.tools.source_checks import assert_vector_regions, cuda_dynamic_shared_bytes, dma_counts
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_mhc.kernels.pre_apply_mix import (
    PreApplyMixBwdSpec,
    PreApplyMixFwdSpec,
    build_pre_apply_mix_bwd,
    build_pre_apply_mix_fwd,
    max_hidden,
)


def _check_common(src: str, name: str) -> None:
    assert f"__global__ __vector__ void {name}" in src
    assert "block_idx" in src
    # assert_vector_regions also fails on scalar UB accesses in a SIMD region and on a barrier
    # inside a thread-guarded branch.
    assert_vector_regions(src, simd=1, simt=0)
    assert "vlds_unpack<uint16_t>" in src


@pytest.mark.parametrize("flavor", ["ascend"])
def test_ascend_forward(flavor):
    src = build_pre_apply_mix_fwd.source(PreApplyMixFwdSpec(4, flavor), "ascend")
    _check_common(src, "pre_apply_mix_fwd_kernel")
    # In: the weights and the streams; out: the mixed row.
    assert dma_counts(src) == (2, 1)
    # The three fused steps after the first product, and the weights gathered into the lanes.
    assert src.count("vmula(") >= 3 and "vselr(" in src
    assert "vsts_pack_b32" in src


@pytest.mark.slow
def test_ascend_forward_cuda_flavor():
    # The cuda flavor's chain (every step fused) lowers too (only the cpu target can choose it).
    src = build_pre_apply_mix_fwd.source(PreApplyMixFwdSpec(4, "cuda"), "ascend")
    assert src.count("vmula(") >= 4


def test_ascend_backward():
    src = build_pre_apply_mix_bwd.source(PreApplyMixBwdSpec(4, 200), "ascend")
    _check_common(src, "pre_apply_mix_bwd_kernel")
    # In: o_grad, x, x_grad, the weights; out: x_grad, mix_grad.
    assert dma_counts(src) == (4, 2)
    # The fused row sums fold their partials by deinterleaving and store one lane per stream.
    assert "vmula(" in src and "vdintlv(" in src and "vsts_1st" in src


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 4, 16])
def test_ascend_backward_fits_the_unified_buffer(n):
    lowering = build_pre_apply_mix_bwd.ascend_lowering(PreApplyMixBwdSpec(n, max_hidden(n)))
    assert lowering.ub_bytes <= UB_BYTES


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow), 4, pytest.param(16, marks=pytest.mark.slow)])
def test_cuda_backward_fits_a_block_at_the_largest_hidden_size(n):
    # The kernel source does not say how much shared memory a launch takes: the lowering's buffer does.
    func = build_pre_apply_mix_bwd(PreApplyMixBwdSpec(n, max_hidden(n)), "cuda")
    assert cuda_dynamic_shared_bytes(func) <= CUDA_SHARED_LIMIT


@pytest.mark.cuda_compile
def test_cuda_forward_compiles():
    src = build_pre_apply_mix_fwd.source(PreApplyMixFwdSpec(4, "cuda"), "cuda")
    assert "__global__ void" in src and "pre_apply_mix_fwd_kernel" in src
    # nvcc contracts nothing here: the chain's fused steps are explicit fmaf calls.
    assert src.count("fmaf(") >= 4
    check_cuda_source(src)


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_backward_compiles():
    src = build_pre_apply_mix_bwd.source(PreApplyMixBwdSpec(4, 200), "cuda")
    assert_cuda_compiles(src, "pre_apply_mix_bwd_kernel")
