"""batched_transpose_weight_sf lowers for ascend and cuda.

Ascend: per work tile, the generated AscendC loads the scale tile by DMA, forms the packed words
in one SIMT region (a transpose with edge masks and the status store), broadcasts them in one
SIMD region of vector instructions, and stores both staging tiles by DMA.
CUDA: the source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_quant.kernels.batched_transpose_weight_sf import TransposeSpec, build_batched_transpose_weight_sf


# Block 32 is the lowering the ascend-sim tests run; 128 is a kernel of its own.
@pytest.mark.parametrize("block_size", [32, pytest.param(128, marks=pytest.mark.slow)])
def test_ascend_lowering(block_size):
    src = build_batched_transpose_weight_sf.source(TransposeSpec(block_size, 2), "ascend")
    assert "__global__ __vector__ void batched_transpose_weight_sf_kernel" in src
    regions = assert_vector_regions(src, simd=1, simt=1)
    assert all(r.vector_ops > 0 for r in regions if r.kind == "simd")
    assert dma_counts(src) == (1, 2)


@pytest.mark.cuda_compile
@pytest.mark.parametrize("block_size", [128, pytest.param(32, marks=pytest.mark.slow)])
def test_cuda_lowering_compiles(block_size):
    src = build_batched_transpose_weight_sf.source(TransposeSpec(block_size, 4), "cuda")
    assert_cuda_compiles(src, "batched_transpose_weight_sf_kernel")
