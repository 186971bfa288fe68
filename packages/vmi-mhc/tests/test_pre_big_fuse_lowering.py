"""pre_big_fuse's kernel lowers for ascend and cuda.

Ascend: persistent token blocks over the cores (``block_idx``, a wave loop over the blocks). DMA in:
the biases (once per core), the partial products and square sums (per split), the residual slices
(per token and hidden tile); DMA out: the post and comb mixes (per block) and the layer-input slices
— the pre mix is never stored. Every phase but one is a SIMD region of real vector code: zeroing
the accumulators, adding a split, the mixes (RMS scale, logits, the exps' arguments; then sigmoid
and Sinkhorn with the division a vector instruction, the token columns gathered and scattered in
UB), the stream mix; the exps are a SIMT region calling vmi's correctly rounded exp (no hardware
transcendental). No scalar UB access in a SIMD region, no barrier inside a thread-guarded branch;
the tiles fit the unified buffer. CUDA: the source compiles with nvcc for an explicit arch.

The spec is the one test_pre_big_fuse runs on ascend-sim (their lowering is shared). Both tests run
under ``slow``: the Ascend lowering of this kernel takes about 10 s (most of it the pass that
schedules the block loop).
"""

from __future__ import annotations

import pytest

from vmi_core.ascend_sim import UB_BYTES_WITH_SIMT
from vmi_core.tools.source_checks import (
    assert_vector_regions,
    barriers_in_thread_guards,
    dma_counts,
    transcendental_calls,
)
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_mhc.kernels.pre_big_fuse import PreBigFuseSpec, build_pre_big_fuse

ASCEND = PreBigFuseSpec(4 * 1280, 1e-6, "ascend")
CUDA = PreBigFuseSpec(4 * 1280, 1e-6, "cuda")


@pytest.mark.slow
def test_ascend_kernel():
    src = build_pre_big_fuse.source(ASCEND, "ascend")
    assert "__global__ __vector__ void pre_big_fuse_fwd_kernel" in src
    assert "block_idx" in src
    regions = assert_vector_regions(src, simd=5, simt=1)
    assert all(region.scalar_accesses == 0 for region in regions if region.kind == "simd")
    assert barriers_in_thread_guards(src) == 0
    # In: biases, partial products, partial square sums, residual. Out: post, comb, layer input.
    assert dma_counts(src) == (4, 3)
    assert "vdiv" in src and "vgather2" in src and "vscatter" in src
    assert "vmi_exp(" in src and transcendental_calls(src) == []
    lowering = build_pre_big_fuse.ascend_lowering(ASCEND)
    assert lowering.ub_bytes <= UB_BYTES_WITH_SIMT


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_kernel_compiles():
    src = build_pre_big_fuse.source(CUDA, "cuda")
    assert_cuda_compiles(src, "pre_big_fuse_fwd_kernel")
