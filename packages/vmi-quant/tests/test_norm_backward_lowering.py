"""norm_backward's two kernels lower for ascend and cuda.

Ascend, row kernel: persistent row blocks over the 64 cores (``block_idx``, a wave loop over the
blocks), the weight loaded once per core and every tile of x, out_grad (and residual_out_grad)
and rstd loaded by DMA, x_grad and the partial rows of the weight gradient stored by DMA; the
compute is real vector code in SIMD regions (the zeroing of a block's partial row; the row dots,
x_grad and the weight-gradient partials of a tile), no SIMT region, no barrier inside a
thread-guarded branch. Reduction kernel: DMA of the gradient buffer and of the workspace chunks,
three SIMD regions (zeroing, the ordered sum, the final addition and rounding). CUDA: both
sources compile with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.ascend_sim import UB_BYTES
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.lowering import assert_cuda_compiles
from vmi_quant.kernels.norm_backward import (
    NormBackwardSpec,
    WeightGradReduceSpec,
    build_norm_backward,
    build_weight_grad_reduce,
)

# (x dtype, H, weight, residual_out_grad, out_scale, flavor): a register tail with every input;
# the largest hidden size, fp32, without weight or residual gradient.
# The default specs are those test_norm_backward runs on ascend-sim (their lowering is shared).
ROW_SPECS = [NormBackwardSpec("bf16", 96, True, True, 0.3, "ascend")]
MORE_ROW_SPECS = [NormBackwardSpec("fp32", 8192, False, False, 1.0, "ascend"),
                  NormBackwardSpec("fp32", 8192, True, True, 0.3, "ascend")]
CUDA_ROW_SPECS = [NormBackwardSpec("bf16", 96, True, True, 0.3, "cuda")]
MORE_CUDA_ROW_SPECS = [NormBackwardSpec("fp32", 96, False, False, 0.3, "cuda")]
REDUCE_SPECS = [WeightGradReduceSpec(96, "bf16")]
MORE_REDUCE_SPECS = [WeightGradReduceSpec(8192, "fp32")]


def _id(spec) -> str:
    return "-".join(str(v) for v in vars(spec).values())


def _check_ascend_row_kernel(spec):
    src = build_norm_backward.source(spec, "ascend")
    assert "__global__ __vector__ void norm_backward_kernel" in src
    assert "block_idx" in src
    # assert_vector_regions also fails on scalar UB accesses in a SIMD region and on a barrier
    # inside a thread-guarded branch.
    assert_vector_regions(src, simd=1 + spec.has_weight, simt=0)
    # In: x, out_grad, rstd (+ residual_out_grad, + the weight). Out: x_grad (+ the partial rows).
    assert dma_counts(src) == (3 + spec.has_residual_grad + spec.has_weight, 1 + spec.has_weight)


@pytest.mark.parametrize("spec", ROW_SPECS, ids=_id)
def test_ascend_row_kernel(spec):
    _check_ascend_row_kernel(spec)


@pytest.mark.slow
@pytest.mark.parametrize("spec", MORE_ROW_SPECS, ids=_id)
def test_ascend_row_kernel_more(spec):
    _check_ascend_row_kernel(spec)
    # The largest tiles (fp32, H 8192, every input) fit the vector core's unified buffer.
    lowering = build_norm_backward.ascend_lowering(spec)
    assert lowering.ub_bytes <= UB_BYTES


@pytest.mark.parametrize("spec", REDUCE_SPECS + MORE_REDUCE_SPECS, ids=_id)
def test_ascend_reduction_kernel(spec):
    src = build_weight_grad_reduce.source(spec, "ascend")
    assert "__global__ __vector__ void weight_grad_reduce_kernel" in src
    assert "block_idx" in src
    assert_vector_regions(src, simd=3, simt=0)
    assert dma_counts(src) == (2, 1)


@pytest.mark.cuda_compile
@pytest.mark.parametrize("spec", CUDA_ROW_SPECS, ids=_id)
def test_cuda_row_kernel_compiles(spec):
    src = build_norm_backward.source(spec, "cuda")
    assert_cuda_compiles(src, "norm_backward_kernel")


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("spec", MORE_CUDA_ROW_SPECS, ids=_id)
def test_cuda_row_kernel_compiles_more(spec):
    check_cuda_source(build_norm_backward.source(spec, "cuda"))


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("spec", REDUCE_SPECS + MORE_REDUCE_SPECS, ids=_id)
def test_cuda_reduction_kernel_compiles(spec):
    src = build_weight_grad_reduce.source(spec, "cuda")
    assert_cuda_compiles(src, "weight_grad_reduce_kernel")
