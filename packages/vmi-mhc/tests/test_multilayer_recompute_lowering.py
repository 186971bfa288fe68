"""mhc_multilayer_recompute lowers for ascend and cuda.

Ascend: persistent ``(token, hidden tile)`` items over the 64 cores (``block_idx``); per item the
residual tile loaded once by DMA, then per layer the pre, post and comb rows and the layer-output
tile in and the layer-input and residual tiles out; one SIMD region of real vector code per layer
body (broadcast loads of the mixes, fused multiply-adds), no SIMT region; the largest tiles fit the
unified buffer. CUDA: the source compiles with nvcc for an explicit arch, with no barrier in a
thread-guarded branch.
"""

from __future__ import annotations

import pytest

from vmi_core.ascend_sim import UB_BYTES
from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_devkit.cuda import check_cuda_source
from vmi_mhc.kernels.multilayer_recompute import MultilayerRecomputeSpec, build_multilayer_recompute

# The default spec is the one test_multilayer_recompute runs on ascend-sim (its lowering is shared).
DEFAULT = MultilayerRecomputeSpec(4, 1000, 1, 1, "ascend")


def _check(spec):
    src = build_multilayer_recompute.source(spec, "ascend")
    assert "__global__ __vector__ void multilayer_recompute_kernel" in src
    assert "block_idx" in src
    # Layer bodies: a pair of post layers in the loop when L_post >= 2, one more for an odd L_post,
    # and the last layer input alone when L > L_post.
    post_bodies = 2 * (spec.num_post_layers >= 2) + spec.num_post_layers % 2
    input_bodies = int(spec.num_layers > spec.num_post_layers)
    # assert_vector_regions also fails on scalar UB accesses in a SIMD region and on a barrier
    # inside a thread-guarded branch.
    assert_vector_regions(src, simd=post_bodies + input_bodies, simt=0)
    assert "vlds_brc" in src and "vmula" in src
    assert dma_counts(src) == (1 + 4 * post_bodies + input_bodies, 2 * post_bodies + input_bodies)
    return src


def test_ascend():
    _check(DEFAULT)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [MultilayerRecomputeSpec(4, 8192, 3, 2, "ascend"),
                                  MultilayerRecomputeSpec(8, 7168, 10, 10, "ascend"),
                                  MultilayerRecomputeSpec(4, 96, 2, 1, "ascend")], ids=str)
def test_ascend_more(spec):
    _check(spec)
    lowering = build_multilayer_recompute.ascend_lowering(spec)
    assert lowering.ub_bytes <= UB_BYTES


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_compiles():
    src = build_multilayer_recompute.source(MultilayerRecomputeSpec(4, 1000, 3, 2, "cuda"), "cuda")
    assert "__global__ void" in src and "multilayer_recompute_kernel" in src
    assert barriers_in_thread_guards(src) == 0
    check_cuda_source(src)
