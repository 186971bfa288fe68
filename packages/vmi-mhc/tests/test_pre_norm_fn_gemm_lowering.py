"""The prenorm GEMM's kernels lower for ascend and cuda.

Ascend, forward: a mixed (Cube + vector) kernel, persistent over (token block, split) work items
on the 32 AI cores; the Cube side loads x and the operand's bf16 hi and lo chunks into L1 by DMA
and runs two L1 GEMMs per chunk into the L0C accumulator, which is stored straight to global
memory; the vector side DMAs x into UB and computes the square sums in SIMD regions (zeroing,
lane accumulation, the fixed-order fold), no scalar UB access, no SIMT region, no barrier inside a
thread-guarded branch. Backward: four L1 GEMMs (d·v as hi/lo pairs) into L0C, moved to the UB of
the AI core's first vector core, which alone runs the vector side; fn_grad and x_grad in SIMD
regions; x_grad and fn_grad stored by DMA. Operand kernel: one SIMD region between its DMAs. CUDA:
the GEMMs are tensor-core MMAs and both sources compile with nvcc.
"""

from __future__ import annotations

import re

import pytest

from vmi_core.tools.source_checks import assert_vector_regions, dma_counts
from vmi_devkit.cuda import check_cuda_source
from vmi_mhc.kernels.pre_norm_fn_gemm import (
    ASCEND_AI_CORES,
    GemmSpec,
    Tf32SplitSpec,
    build_gemm_bwd,
    build_gemm_fwd,
    build_tf32_split,
)

FWD = GemmSpec(512, 24, 2)
BWD = GemmSpec(512, 24)


def _persistent_over_ai_cores(src: str) -> bool:
    # Work item ``w * workers + block_idx`` of wave ``w``, on both the Cube and the vector side.
    waves = re.findall(r"\(w(?:_\d+)? \* (\d+)\) \+ \(\(int32_t\)block_idx\)", src)
    return bool(waves) and set(waves) == {str(ASCEND_AI_CORES)}


def test_ascend_forward():
    src = build_gemm_fwd.source(FWD, "ascend")
    assert "__mix__(1, 2) void gemm_fwd_kernel" in src
    assert "if ASC_IS_AIC" in src and "if ASC_IS_AIV" in src
    assert _persistent_over_ai_cores(src)
    cube, vector = src.split("if ASC_IS_AIV")
    # x, hi and lo to L1; two GEMMs (x·hiᵀ, x·loᵀ) per chunk; the accumulator to global memory.
    assert cube.count("asc_copy_gm2l1_nd2nz") == 3
    assert cube.count("ascend_gemm_l1<32, 256, 32, 256, true, bfloat16_t>") == 2
    assert cube.count("asc_copy_l0c2gm") == 1
    assert_vector_regions(src, simd=3, simt=0)
    # Vector side: x in, the square sums out.
    assert dma_counts(vector) == (1, 1)


def test_ascend_backward():
    src = build_gemm_bwd.source(BWD, "ascend")
    assert "__mix__(1, 2) void gemm_bwd_kernel" in src
    assert _persistent_over_ai_cores(src)
    cube, vector = src.split("if ASC_IS_AIV")
    # The vector phases on sub-block 0 only: the Cube's products reach its UB alone.
    assert vector.lstrip(" {\n").startswith("if (asc_get_sub_block_id() == 0) {")
    # The fn operand (hi, lo) and d (hi, lo) to L1; d·v as four GEMMs into L0C, moved to UB.
    assert cube.count("asc_copy_gm2l1_nd2nz") == 4
    assert cube.count("ascend_gemm_l1<32, 32, 256, 32, true, bfloat16_t>") == 4
    assert cube.count("asc_copy_l0c2ub") == 1
    # Zeroing of fn_grad; per token block the join of d, fn_grad and x_grad.
    assert_vector_regions(src, simd=2, simt=0)
    # In: x_grad, x, d (hi, lo), d_sqrsum; out: x_grad, fn_grad.
    assert dma_counts(vector) == (5, 2)


def test_ascend_operand_kernel():
    src = build_tf32_split.source(Tf32SplitSpec(), "ascend")
    assert "__global__ __vector__ void tf32_split_kernel" in src
    assert_vector_regions(src, simd=1, simt=0)
    assert dma_counts(src) == (1, 2)


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_forward_compiles():
    src = build_gemm_fwd.source(FWD, "cuda")
    assert "tl::mma_sync<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32" in src
    check_cuda_source(src)


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_backward_compiles():
    src = build_gemm_bwd.source(BWD, "cuda")
    assert "tl::mma_sync<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32" in src
    check_cuda_source(src)


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_operand_kernel_compiles():
    check_cuda_source(build_tf32_split.source(Tf32SplitSpec(), "cuda"))


@pytest.mark.slow
@pytest.mark.parametrize("spec", [GemmSpec(4 * 7168, 24, 16), GemmSpec(4 * 7168, 24, 1), GemmSpec(4 * 1280, 8, 4)],
                         ids=lambda s: f"K{s.hidden}-n3{s.mix}-S{s.n_splits}")
def test_ascend_forward_more(spec):
    src = build_gemm_fwd.source(spec, "ascend")
    assert "ascend_gemm_l1<" in src and "asc_copy_l0c2gm" in src
    assert_vector_regions(src, simd=3, simt=0)
