"""pre_split_mixes' three kernels lower for ascend and cuda.

Ascend: persistent token tiles over the 64 cores (``block_idx``, a wave loop over the tiles). The
forward loads the mixes by DMA (and the biases once per core) and stores the three mixes by DMA; the
backward loads the mixes, the three output gradients and the saved post mix (and the biases) and
stores the mix gradient and the tile's partial row; both compute in SIMD regions of real vector
code (the backward also zeroes its partial row once per core; no scalar UB access, no barrier inside
a thread-guarded branch) but for the sigmoids' exps, a SIMT region calling vmi's correctly rounded
exp (no hardware transcendental). The reduction loads workspace chunks by DMA and adds
them in SIMD regions (zeroing, a register per row); only the final single-element stores of the
two gradients run in a SIMT region. CUDA: the sources compile with nvcc for an explicit arch.

The default specs are the ones test_pre_split_mixes runs on ascend-sim (their lowering is shared).
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
from vmi_mhc.kernels.pre_split_mixes import (
    REDUCE_SPEC,
    PreSplitMixesSpec,
    build_pre_split_mixes_bwd,
    build_pre_split_mixes_bwd_reduce,
    build_pre_split_mixes_fwd,
)

ASCEND = PreSplitMixesSpec("ascend")
CUDA = PreSplitMixesSpec("cuda")


def test_ascend_forward_kernel():
    src = build_pre_split_mixes_fwd.source(ASCEND, "ascend")
    assert "__global__ __vector__ void pre_split_mixes_fwd_kernel" in src
    assert "block_idx" in src
    # The sigmoids' arguments, their exps (Shell.exp: SIMT), the split.
    assert_vector_regions(src, simd=2, simt=1)
    # In: the biases, the mixes. Out: pre, post, comb.
    assert dma_counts(src) == (2, 3)
    # The sigmoid's division is the vector instruction; its exp vmi's.
    assert "vdiv" in src and "vmi_exp(" in src and transcendental_calls(src) == []


def test_ascend_backward_kernels():
    src = build_pre_split_mixes_bwd.source(ASCEND, "ascend")
    assert "__global__ __vector__ void pre_split_mixes_bwd_kernel" in src
    assert "block_idx" in src
    # Zeroing the partial row; per tile the sigmoids' arguments, their exps (SIMT), the backward.
    assert_vector_regions(src, simd=3, simt=1)
    # In: the biases, the mixes, three gradients, the post mix. Out: the mix gradient, the partial row.
    assert dma_counts(src) == (6, 2)
    assert "vdiv" in src and "vmi_exp(" in src and transcendental_calls(src) == []
    lowering = build_pre_split_mixes_bwd.ascend_lowering(ASCEND)
    assert lowering.ub_bytes <= UB_BYTES_WITH_SIMT
    src = build_pre_split_mixes_bwd_reduce.source(REDUCE_SPEC, "ascend")
    assert "__global__ __vector__ void pre_split_mixes_bwd_reduce_kernel" in src
    assert_vector_regions(src, simd=2, simt=1)
    assert barriers_in_thread_guards(src) == 0
    assert dma_counts(src) == (1, 0)


@pytest.mark.cuda_compile
def test_cuda_forward_kernel_compiles():
    src = build_pre_split_mixes_fwd.source(CUDA, "cuda")
    assert_cuda_compiles(src, "pre_split_mixes_fwd_kernel")


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_backward_kernels_compile():
    reduce = build_pre_split_mixes_bwd_reduce.source(REDUCE_SPEC, "cuda")
    for src, name in ((build_pre_split_mixes_bwd.source(CUDA, "cuda"), "pre_split_mixes_bwd_kernel"),
                      (reduce, "pre_split_mixes_bwd_reduce_kernel")):
        assert_cuda_compiles(src, name)
