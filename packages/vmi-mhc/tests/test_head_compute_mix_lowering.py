"""head_compute_mix's two kernels lower for ascend and cuda.

Ascend: persistent work over the 64 cores (``block_idx``, a wave loop). The forward loads the
biases once per core and each token tile's input by DMA, computes the mix in SIMD regions of real
vector code (the sigmoid's division a vector instruction) but for the sigmoids' exps, a SIMT region
calling vmi's correctly rounded exp (no hardware transcendental), and stores it by DMA. The
backward loads the biases once per core, then per token tile the input and the output gradient,
stores the input gradient by DMA, and computes in SIMD regions: the accumulators' zeroing per
partial row, the tile's gradients and accumulation, and the lane-order fold of the accumulators;
the exps and the final single-element stores of the two partial rows run in SIMT regions. No scalar
UB access in a SIMD region, no barrier inside a thread-guarded branch, and the UB fits. CUDA: the
sources compile with nvcc for an explicit arch.

The default specs are the ones test_head_compute_mix runs on ascend-sim (their lowering is shared).
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
from vmi_mhc.kernels.head_compute_mix import HeadComputeMixSpec, build_head_compute_mix_bwd, build_head_compute_mix_fwd

ASCEND = HeadComputeMixSpec(4, "ascend")
CUDA = HeadComputeMixSpec(4, "cuda")


def check_forward(spec):
    src = build_head_compute_mix_fwd.source(spec, "ascend")
    assert "__global__ __vector__ void head_compute_mix_fwd_kernel" in src
    assert "block_idx" in src
    # The sigmoids' arguments, their exps (Shell.exp: SIMT), the mix.
    regions = assert_vector_regions(src, simd=2, simt=1)
    assert all(region.scalar_accesses == 0 for region in regions if region.kind == "simd")
    # In: the biases, the input. Out: the mix.
    assert dma_counts(src) == (2, 1)
    assert "vdiv" in src and "vmi_exp(" in src and transcendental_calls(src) == []
    assert build_head_compute_mix_fwd.ascend_lowering(spec).ub_bytes <= UB_BYTES_WITH_SIMT


def check_backward(spec):
    src = build_head_compute_mix_bwd.source(spec, "ascend")
    assert "__global__ __vector__ void head_compute_mix_bwd_kernel" in src
    assert "block_idx" in src
    # Zeroing; per tile the sigmoids' arguments, their exps (SIMT), the backward; the fold.
    regions = assert_vector_regions(src, simd=4, simt=2)
    assert all(region.scalar_accesses == 0 for region in regions if region.kind == "simd")
    assert barriers_in_thread_guards(src) == 0
    # In: the biases, the input, the output gradient. Out: the input gradient.
    assert dma_counts(src) == (3, 1)
    assert "vdiv" in src and "vmi_exp(" in src and transcendental_calls(src) == []
    assert build_head_compute_mix_bwd.ascend_lowering(spec).ub_bytes <= UB_BYTES_WITH_SIMT


def test_ascend_kernels():
    check_forward(ASCEND)
    check_backward(ASCEND)


@pytest.mark.slow
@pytest.mark.parametrize("n", (1, 16))
def test_ascend_kernels_other_stream_counts(n):
    check_forward(HeadComputeMixSpec(n, "ascend"))
    check_backward(HeadComputeMixSpec(n, "ascend"))


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_kernels_compile():
    for src, name in ((build_head_compute_mix_fwd.source(CUDA, "cuda"), "head_compute_mix_fwd_kernel"),
                      (build_head_compute_mix_bwd.source(CUDA, "cuda"), "head_compute_mix_bwd_kernel")):
        assert_cuda_compiles(src, name)
