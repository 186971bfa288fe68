"""expand's two kernels lower for ascend and cuda.

Ascend: persistent (token, hidden tile) work items over the 64 cores (``block_idx``, a wave loop),
one DMA in and one DMA out per item (the forward's ``(n, BLOCK_H)`` tile out to the token's ``n``
streams in one transfer), the copy and the stream sum as real vector code in one SIMD region, no
SIMT region, no scalar UB access in the SIMD region, no barrier inside a thread-guarded branch.
CUDA: the sources compile with nvcc for an explicit arch. The default specialisation (n = 4) is the
one test_expand runs on ascend-sim (their lowering is shared): the backward by default, the forward
under slow, so the forward's lowering here is the default run's only Ascend check of that kernel.
"""

from __future__ import annotations

import pytest

from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_mhc.kernels.expand import ExpandSpec, build_expand_bwd, build_expand_fwd

SOURCES = {"fwd": build_expand_fwd.source, "bwd": build_expand_bwd.source}


def _check_ascend(direction: str, n: int) -> None:
    src = SOURCES[direction](ExpandSpec(n), "ascend")
    assert f"__global__ __vector__ void expand_{direction}_kernel" in src
    assert "block_idx" in src
    # assert_vector_regions also fails on scalar UB accesses in a SIMD region and on a barrier
    # inside a thread-guarded branch.
    assert_vector_regions(src, simd=1, simt=0)
    # The bf16 lanes are widened by the loads and packed by the stores.
    assert "vlds_unpack<uint16_t>" in src and "vsts_pack_b32" in src
    assert dma_counts(src) == (1, 1)
    if direction == "bwd":
        # The n - 1 additions of the streams are vector additions.
        assert src.count("vadd(") >= n - 1


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_ascend_kernels(direction):
    _check_ascend(direction, 4)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 16])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_ascend_kernels_other_stream_counts(direction, n):
    _check_ascend(direction, n)


@pytest.mark.cuda_compile
def test_cuda_backward_compiles():
    src = build_expand_bwd.source(ExpandSpec(4), "cuda")
    assert_cuda_compiles(src, "expand_bwd_kernel")


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_forward_compiles():
    src = build_expand_fwd.source(ExpandSpec(4), "cuda")
    assert_cuda_compiles(src, "expand_fwd_kernel")
