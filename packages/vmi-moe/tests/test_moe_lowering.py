"""topk_gate, normalize_weight and moe_topk_gate_forward lower for ascend and cuda.

Ascend (ascend flavor, the only one that target runs): the generated AscendC has one
SIMT region (the per-token lane body) and no SIMD region; normalize_weight one SIMD region
(64 rows a register, one per lane) and no SIMT region; topk_gate one SIMD region (the scans)
and one SIMT region (the status word); DMA copies in and out for
every tensor that is staged on chip (at least: the row tile; for the gate also the bias
rows, the replica map and counts and the fixed experts; out: indices and weights, plus
the logical indices and scores when requested), and persistent scheduling over the
vector cores (``block_idx``). CUDA (cuda flavor): the source compiles with nvcc for an
explicit arch, where nvcc is installed. The gate's sources (ascend, cuda and cpu, both flavors)
call no exp/log-family function: its sqrt-softplus uses vmi-core's correctly rounded exp and
log1p, built from fp32 arithmetic. A covering set runs by default; the sweeps are slow.
"""

import itertools

import pytest

from vmi_core.tools.source_checks import (
    assert_vector_regions,
    barriers_in_thread_guards,
    dma_counts,
    nvcc_compile,
    transcendental_calls,
)
from vmi_devkit.cases.moe_cases import GateCase, gate_spec
from vmi_devkit.cuda import check_cuda_source
from vmi_moe.kernels.moe_topk_gate import GateSpec, build_moe_topk_gate
from vmi_moe.kernels.normalize_weight import NormalizeWeightSpec, build_normalize_weight
from vmi_moe.kernels.topk_gate import TopkGateSpec, build_topk_gate


def expected_dma(spec: GateSpec) -> tuple[int, int]:
    """Lower bounds of (GM->UB, UB->GM) DMA copies of a gate kernel."""
    gm_to_ub = 1 + spec.has_bias + spec.has_image + 2 * spec.has_map + spec.has_fixed
    ub_to_gm = 2 + spec.has_unmapped + spec.has_scores
    return gm_to_ub, ub_to_gm


def check_ascend(src: str, kernel: str, dma: tuple[int, int], regions=(0, 1)) -> None:
    assert f"__global__ __vector__ void {kernel}" in src
    assert_vector_regions(src, simd=regions[0], simt=regions[1])
    # Per-token loops run on fewer lanes than the region has threads: no barrier inside them.
    assert barriers_in_thread_guards(src) == 0
    gm_to_ub, ub_to_gm = dma_counts(src)
    assert gm_to_ub >= dma[0], f"{gm_to_ub} GM->UB copies, expected at least {dma[0]}"
    assert ub_to_gm >= dma[1], f"{ub_to_gm} UB->GM copies, expected at least {dma[1]}"
    assert "block_idx" in src


ALL = dict(mask=True, bias=True, image=True, fixed=True, force=True)
GATE_ASCEND = [
    GateCase(256, 8, S=2, dup=3, **ALL),
    GateCase(72, 6),
    GateCase(384, 6, S=1, dup=1, mask=True, image=True, force=True, unmapped=True, scores=False),
]
# The default run lowers the gate with every input (each lowering takes seconds); the plain gate and
# the unmapped-output one in the slow run.
GATE_ASCEND_PARAMS = [pytest.param(case, id=case.id, marks=[pytest.mark.slow] if i else [])
                      for i, case in enumerate(GATE_ASCEND)]
# Sizes test_topk_gate runs on ascend-sim by default (their lowering is cached, so they cost nothing more).
TOPK_ASCEND = [TopkGateSpec(256, 8), TopkGateSpec(36, 1)]
# By default the K test_normalize_weight runs on ascend-sim (9: its lowering is cached; the regions and
# DMA do not depend on K); the gate's K = 6 and a full warp in the slow run.
NORMALIZE_ASCEND = [pytest.param(NormalizeWeightSpec(k, "ascend"), id=f"K{k}",
                                 marks=[] if k == 9 else [pytest.mark.slow]) for k in (9, 6, 32)]


@pytest.mark.parametrize("case", GATE_ASCEND_PARAMS)
def test_gate_ascend_lowering(case: GateCase) -> None:
    spec = gate_spec(case)
    src = build_moe_topk_gate.source(spec, "ascend")
    check_ascend(src, "moe_topk_gate_kernel", expected_dma(spec))
    assert transcendental_calls(src) == []


def test_gate_cpu_source_calls_no_library_exp_or_log() -> None:
    # The cuda flavor (exp and log1p; the ascend flavor's exp is in the Ascend source above); the cuda
    # target's source is checked where it compiles (test_cuda_lowering_compiles).
    spec = gate_spec(GateCase(16, 2, flavor="cuda"))
    assert transcendental_calls(build_moe_topk_gate.source(spec, "cpu")) == []


@pytest.mark.parametrize("spec", TOPK_ASCEND, ids=lambda s: f"E{s.num_experts}-K{s.num_topk}")
def test_topk_gate_ascend_lowering(spec: TopkGateSpec) -> None:
    # The scans in one SIMD region, the status word in one SIMT region.
    check_ascend(build_topk_gate.source(spec, "ascend"), "topk_gate_kernel", (1, 1), regions=(1, 1))


@pytest.mark.parametrize("spec", NORMALIZE_ASCEND)
def test_normalize_weight_ascend_lowering(spec: NormalizeWeightSpec) -> None:
    # In: the weight rows; out: denominators and normalised rows.
    check_ascend(build_normalize_weight.source(spec, "ascend"), "normalize_weight_kernel", (1, 2), regions=(1, 0))


# nvcc compiles in the slow run (the default run's budget; the gate with every input among them).
CUDA_CASES = [
    pytest.param("topk_gate-E72-K6", lambda: build_topk_gate.source(TopkGateSpec(72, 6), "cuda"), "topk_gate_kernel",
                 id="topk_gate-E72-K6", marks=pytest.mark.slow),
    pytest.param("normalize_weight-K8", lambda: build_normalize_weight.source(NormalizeWeightSpec(8, "cuda"), "cuda"),
                 "normalize_weight_kernel", id="normalize_weight-K8", marks=pytest.mark.slow),
    pytest.param("gate-all", lambda: build_moe_topk_gate.source(
                     gate_spec(GateCase(256, 8, S=2, dup=3, flavor="cuda", **ALL)), "cuda"),
                 "moe_topk_gate_kernel", id="gate-all"),
]


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize(("name", "source", "kernel"), CUDA_CASES)
def test_cuda_lowering_compiles(name, source, kernel) -> None:
    src = source()
    assert "__global__ void" in src and kernel in src
    assert barriers_in_thread_guards(src) == 0
    assert transcendental_calls(src) == []
    check_cuda_source(src)


# --- sweeps ------------------------------------------------------------------------------------

FLAG_NAMES = ("mask", "bias", "image", "fixed", "force", "dup")
GATE_PRODUCT = [
    GateCase(72, 6, S=2 if flags[-1] else 0, dup=3 if flags[-1] else 0,
             **{n: v for n, v in zip(FLAG_NAMES[:-1], flags[:-1], strict=True)})
    for flags in itertools.product((False, True), repeat=len(FLAG_NAMES))
]


@pytest.mark.slow
@pytest.mark.parametrize("case", GATE_PRODUCT, ids=lambda c: c.id)
def test_gate_ascend_lowering_full(case: GateCase) -> None:
    spec = gate_spec(case)
    check_ascend(build_moe_topk_gate.source(spec, "ascend"), "moe_topk_gate_kernel", expected_dma(spec))


SIZES = [(16, 6), (36, 32), (72, 6), (144, 6), (256, 8), (384, 8), (500, 32)]


@pytest.mark.slow
@pytest.mark.parametrize(("E", "K"), SIZES, ids=[f"E{e}-K{k}" for e, k in SIZES])
def test_sizes_ascend_lowering_full(E: int, K: int) -> None:
    check_ascend(build_topk_gate.source(TopkGateSpec(E, K), "ascend"), "topk_gate_kernel", (1, 1), regions=(1, 1))
    spec = gate_spec(GateCase(E, min(K, 30), S=2, dup=2, **ALL))
    check_ascend(build_moe_topk_gate.source(spec, "ascend"), "moe_topk_gate_kernel", expected_dma(spec))


@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 2, 3, 7, 8, 9, 16, 17, 31, 32])
def test_normalize_weight_ascend_lowering_full(K: int) -> None:
    check_ascend(build_normalize_weight.source(NormalizeWeightSpec(K, "ascend"), "ascend"), "normalize_weight_kernel",
                 (1, 2), regions=(1, 0))


@pytest.mark.slow
@pytest.mark.cuda_compile
@pytest.mark.parametrize("case", [GateCase(**{**c.__dict__, "flavor": "cuda"}) for c in GATE_ASCEND]
                         + [GateCase(72, 1, S=1, dup=1, flavor="cuda", mask=True, force=True)], ids=lambda c: c.id)
def test_gate_cuda_lowering_compiles_all(case: GateCase) -> None:
    src = build_moe_topk_gate.source(gate_spec(case), "cuda")
    check_cuda_source(src)
    src = build_normalize_weight.source(NormalizeWeightSpec(case.K, "cuda"), "cuda")
    nvcc_compile(src)
    nvcc_compile(build_topk_gate.source(TopkGateSpec(case.E, case.K), "cuda"))
