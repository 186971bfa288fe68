"""moe_topk_gate_backward lowers for ascend and cuda, with and without the auxiliary term.

Ascend: the generated AscendC runs the per-token statistics in a SIMT region, the one-hot
route sum in a SIMD region (one token per vector lane) and the derivative in a second SIMT
region (the README's "differences by target": status stores, gathers by expert index, the
derivative's exp); the score rows, index pairs, weights and weight
gradients (and, with the auxiliary term, the rows of ``grad_scores_sum``) come in by DMA
and the gradient rows go out by DMA; the sequence rows and the mask are read only when the
term is on; the workers are the vector cores. CUDA: the source compiles with nvcc. No source
(ascend, cuda, cpu) calls an exp/log-family function: the derivative's exp is vmi-core's
correctly rounded one, built from fp32 arithmetic.
"""

import re

import pytest

from vmi_core.tools.source_checks import (
    assert_vector_regions,
    barriers_in_thread_guards,
    dma_counts,
    transcendental_calls,
)
from vmi_devkit.cuda import check_cuda_source
from vmi_moe.kernels.moe_topk_gate_backward import GateBackwardSpec, build_moe_topk_gate_backward


def spec_id(spec: GateBackwardSpec) -> str:
    return f"E{spec.num_experts}-K{spec.num_topk}-{spec.flavor}-{'aux' if spec.has_aux else 'noaux'}"


# A DMA from global memory whose source is the named kernel argument.
_DMA_FROM = r"asc_copy_gm2ub_align\([^;]*\(&\({}\["


def check_ascend_source(src: str, spec: GateBackwardSpec) -> None:
    assert "__global__ __vector__ void moe_topk_gate_backward_kernel" in src
    assert_vector_regions(src, simd=1, simt=2)
    # Per-token loops run on fewer lanes than the region has threads: no barrier inside them.
    assert barriers_in_thread_guards(src) == 0
    gm_to_ub, ub_to_gm = dma_counts(src)
    # scores, index pairs, weights, weight gradients (+ the sequence rows of grad_scores_sum).
    assert gm_to_ub >= (5 if spec.has_aux else 4), f"{gm_to_ub} DMA loads"
    assert ub_to_gm >= 1, "the gradient rows are not stored by DMA"
    for name in ("SCORES", "IDX", "W", "GW"):
        assert re.search(_DMA_FROM.format(name), src), f"{name} is not loaded by DMA"
    assert bool(re.search(_DMA_FROM.format("H"), src)) == spec.has_aux
    assert ("MASK[" in src) == spec.has_aux
    assert "block_idx" in src
    # Unsigned compares against constants must not have become divisions (toolchain note).
    assert "/ (uint32_t)" not in src
    assert transcendental_calls(src) == []


# With and without the auxiliary term: the specialisations the ascend-sim tests run (by default
# moe_backward_cases.SIM_CASES, the aux one), whose lowering is cached on disk (each takes ~16 s).
@pytest.mark.parametrize("spec", [
    pytest.param(GateBackwardSpec(384, 8, "ascend", has_aux=False), id="noaux", marks=pytest.mark.slow),
    pytest.param(GateBackwardSpec(72, 6, "ascend", has_aux=True), id="aux")])
def test_ascend_lowering(spec: GateBackwardSpec):
    check_ascend_source(build_moe_topk_gate_backward.source(spec, "ascend"), spec)


# Tile sizes 128, 32 and 16 rows; K = 1; and K large against E, where the index-pair,
# weight and gradient tiles (and the sequence rows) take much of the UB next to the score rows.
ASCEND_FULL = [GateBackwardSpec(e, k, "ascend", aux)
               for e, k in [(36, 1), (36, 32), (64, 24), (128, 32), (256, 8), (384, 8), (8, 6)]
               for aux in (False, True)]


@pytest.mark.slow
@pytest.mark.parametrize("spec", ASCEND_FULL, ids=spec_id)
def test_ascend_lowering_full(spec: GateBackwardSpec):
    check_ascend_source(build_moe_topk_gate_backward.source(spec, "ascend"), spec)


def check_gate_backward_cuda(spec: GateBackwardSpec) -> None:
    src = build_moe_topk_gate_backward.source(spec, "cuda")
    assert "__global__" in src and "moe_topk_gate_backward_kernel" in src
    assert barriers_in_thread_guards(src) == 0
    assert transcendental_calls(src) == []
    check_cuda_source(src)


def test_cpu_source_calls_no_library_exp():
    # The cuda target's source is checked where it compiles (test_cuda_lowering_compiles).
    spec = GateBackwardSpec(16, 2, "ascend", has_aux=False)
    assert transcendental_calls(build_moe_topk_gate_backward.source(spec, "cpu")) == []


@pytest.mark.cuda_compile
@pytest.mark.parametrize("spec", [GateBackwardSpec(72, 6, "cuda", True), GateBackwardSpec(384, 8, "cuda", False)],
                         ids=spec_id)
@pytest.mark.slow
def test_cuda_lowering_compiles(spec: GateBackwardSpec):
    check_gate_backward_cuda(spec)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("spec", [GateBackwardSpec(e, k, "cuda", aux) for e, k in [(36, 32), (256, 8), (8, 1)]
                                  for aux in (False, True)], ids=spec_id)
def test_cuda_lowering_compiles_all(spec: GateBackwardSpec):
    check_gate_backward_cuda(spec)
