"""swiglu_backward and swiglu_backward_and_per_token_cast lower for ascend and cuda.

Ascend: the generated AscendC loads the gate, up and gradient rows by DMA, runs per work tile a
SIMT region for the rows' psum validity, weights and input scales, a SIMT region for the backward
math (its exp is vmi's correctly rounded one, a function of scalar lanes: no hardware
transcendental), one SIMD region (real vector instructions, no scalar UB access: the
weight-gradient row sums and the E4M3 quantization) where there is one of them, and a SIMT region
for the weight gradient and the SF words (computed addresses: the README's "differences by target"
entry), no barrier inside a thread-guarded branch, and stores the gradient tiles by DMA. CUDA: the
source compiles with nvcc for an explicit arch.
"""

from __future__ import annotations

import pytest

from vmi_core.targets import get_flavor
from vmi_core.tools.source_checks import assert_vector_regions, dma_counts, transcendental_calls
from vmi_devkit.cuda import check_cuda_source
from vmi_quant.kernels.swiglu_backward import build_swiglu_backward
from vmi_quant.ops.swiglu_backward import make_spec
from vmi_quant.sf_layout import SFLayout

# (x format, grad format, npc, packed SF, flavor, weights, clamp, recompute, psum, H). By default the
# plain kernel the default ascend-sim test compiles (its lowering is cached, so it costs the default
# run nothing more) and the E4M3 path, which no default ascend-sim test runs; the rest under ``slow``.
CASES = [
    ("e4m3", "bf16", 32, True, "ascend", True, True, True, True, 256),
    ("bf16", "bf16", None, False, "ascend", True, True, True, True, 128),
]
MORE_CASES = [
    ("fp32", "fp32", None, False, "ascend", False, False, False, False, 64),
    ("e4m3", "fp32", 128, False, "ascend", False, False, False, True, 384),
    ("e4m3", "bf16", 32, False, "ascend", True, False, True, False, 128),
]
# nvcc's time is mostly its fixed cost: the larger E4M3 kernel (in the slow run, as the rest).
CUDA_CASES = [
    ("e4m3", "bf16", 128, True, "cuda", True, True, True, True, 256),
]
MORE_CUDA_CASES = [
    ("bf16", "bf16", None, False, "cuda", True, True, True, True, 128),
]


def case_id(case) -> str:
    in_fmt, grad, npc, packed, flavor, weights, clamp, recompute, psum, hidden = case
    parts = [in_fmt if npc is None else f"e4m3-{npc}{'-packed' if packed else ''}", flavor, f"H{hidden}"]
    return "-".join(parts + [n for n, on in (("w", weights), ("clamp", clamp), ("recompute", recompute),
                                             ("psum", psum)) if on])


def _spec(case):
    in_fmt, grad, npc, packed, flavor, weights, clamp, recompute, psum, hidden = case
    flavor = get_flavor(flavor)
    layout = None if npc is None else SFLayout.of(flavor, packed=packed, col_major=packed)
    out_fmt = "bf16" if npc is not None else in_fmt
    return make_spec(in_fmt, grad, out_fmt, hidden, flavor, weights=weights, clamp=clamp, recompute=recompute,
                     psum=psum, num_per_channels=npc, round_sf=packed, sf_layout=layout)


def _check_ascend(case):
    spec = _spec(case)
    src = build_swiglu_backward.source(spec, "ascend")
    assert "__global__ __vector__ void swiglu_backward_kernel" in src
    quantized = spec.num_per_channels is not None
    # assert_vector_regions also fails on a barrier inside a thread-guarded branch.
    has_simd = spec.weights or quantized
    assert_vector_regions(src, simd=int(has_simd), simt=2 + int(has_simd))
    assert "vmi_exp(" in src and transcendental_calls(src) == []
    # In: gate, up, gradient rows. Out: both gradient halves, act_out, both E4M3 halves.
    assert dma_counts(src) == (3, 2 + int(spec.recompute) + 2 * int(quantized))
    assert "block_idx" in src


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_ascend_lowering(case):
    _check_ascend(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", MORE_CASES, ids=case_id)
def test_ascend_lowering_more(case):
    _check_ascend(case)


def _check_cuda(case):
    src = build_swiglu_backward.source(_spec(case), "cuda")
    assert "__global__ void" in src and "swiglu_backward_kernel" in src
    # The cuda flavor's fused 1 + a'(1 - s) and the weight-gradient row sums.
    assert "fmaf" in src or "__fmaf_rn" in src
    check_cuda_source(src)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", CUDA_CASES, ids=case_id)
def test_cuda_lowering_compiles(case):
    _check_cuda(case)


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", MORE_CUDA_CASES, ids=case_id)
def test_cuda_lowering_compiles_more(case):
    _check_cuda(case)
