"""moe_topk_gate_forward on the cpu target (ascend and cuda flavors) and on ascend-sim (the ascend
flavor, its only one) against the reference.

How the kernel is judged (MoE spec §5):

* bit for bit, end to end: the reference computes its own scores with the torch twin
  ``vmi_moe.softplus.sqrt_softplus`` (the flavor's fp32 operations with the correctly rounded
  exp/log1p the kernel builds from fp32 arithmetic), so scores, ranking keys, selection (ties
  included: equal keys, one rule), denominators, weights, shared slots, replica mapping, the
  logical ``unmapped_topk_idx`` and the zero scores of unrouted tokens must match exactly
  (``assert_bitwise_equal``: dtype, shape, strides, bits); force-random tokens too, since the
  reference reproduces the kernel's hash-based draws; no input is re-drawn for near-ties;
* the scores also within 2 ulp of the correctly rounded value in the ascend flavor
  (``moe_cases.assert_scores_exact``);
* reference-free facts: token classes (masked, force-random, shared slots), the rank
  order of constructed ties, zero logits routing to experts 0..K-1, the replica formula
  evaluated in Python integers, weights equal to ``normalize_weight`` of the selected
  scores times the scaling factor.

The data mix ties, padded (masked) tokens with non-finite logits, fixed routing with
duplicates (and out-of-range experts in tokens that do not use fixed routing), shared
experts S = 1, 2, replica maps with 1..3 replicas and Dup = 1, image and plain biases and
force-random tokens. Each distinct ``GateCase`` is one cpu compile, so the default run
uses a covering set of option combinations; the full products are marked slow.

On ascend-sim (the emitted AscendC on vmi-core's model of the vector core) the same
criteria run by default on the ascend case with every option (S = 2, a 3-replica map),
with two more token counts of more than two work tiles per simulated core
(``moe_cases.wrapping_counts``), the pipe schedule cycling over ``SIM_SCHEDULES`` from one
token count to the next, and on the strided ``unmapped_topk_idx``. Each kernel is lowered
anew per test process (several seconds for the gate), so the other ascend cases and the
flavor-parametrised checks run on ascend-sim in the slow run.
"""

import itertools

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, row_ranges
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_cases import (
    FLAVORS,
    G0,
    SCALE,
    SIM,
    TARGETS,
    GateCase,
    assert_scores_exact,
    assert_token_classes,
    counts_on,
    flavor_targets,
    gate_inputs,
    gate_spec,
    positional,
    run_kernel,
    run_reference,
    tie_expectations,
    token_counts,
    with_ties,
)
from vmi_moe import moe_topk_gate, moe_topk_gate_forward, moe_topk_gate_forward_parallel, normalize_weight

ALL = dict(mask=True, bias=True, image=True, fixed=True, force=True)
EVERYTHING = {
    "ascend": GateCase(256, 8, S=2, dup=3, flavor="ascend", **ALL),
    "cuda": GateCase(384, 6, S=1, dup=1, flavor="cuda", **ALL),
}
PLAIN = {"ascend": GateCase(72, 6, flavor="ascend"), "cuda": GateCase(256, 8, flavor="cuda")}
COVERING = [
    *EVERYTHING.values(),
    *PLAIN.values(),
    GateCase(72, 6, flavor="ascend", mask=True, bias=True),  # bias only
    GateCase(36, 6, S=2, flavor="cuda", image=True, unmapped=True),  # image bias only, shared slots unmapped
    GateCase(72, 1, S=1, dup=3, flavor="cuda", mask=True, force=True),  # K = 1, force-random over a map
    GateCase(36, 32, flavor="ascend", fixed=True, force=True),  # K = 32, force-random over E experts
]
# Without the scores output: judged end to end, and against their twin with scores.
NO_SCORES = [GateCase(256, 8, S=2, dup=3, flavor="ascend", scores=False, **ALL),
             GateCase(72, 6, flavor="cuda", mask=True, bias=True, scores=False)]
# The ascend case that also runs on ascend-sim by default: all options (work tiles of 32 tokens); the
# slow run adds the other ascend cases of the covering set (plain; K = 32 with fixed and force-random
# routing; bias only: tiles of 64).
SIM_COVERING = [EVERYTHING["ascend"]]
SIM_COVERING_SLOW = [PLAIN["ascend"], COVERING[7], COVERING[4]]
EP_RANK = 3


def on_targets(cpu_cases: list[GateCase], sim_cases: list[GateCase], sim_slow: list[GateCase] = ()) -> list:
    """``(case, target)``: ``cpu_cases`` on cpu, ``sim_cases`` on ascend-sim, ``sim_slow`` on ascend-sim in the
    slow run only."""
    slow = [pytest.mark.slow]
    return [*(pytest.param(c, "cpu", id=f"{c.id}-cpu") for c in cpu_cases),
            *(pytest.param(c, SIM, id=f"{c.id}-{SIM}") for c in sim_cases),
            *(pytest.param(c, SIM, id=f"{c.id}-{SIM}", marks=slow) for c in sim_slow)]


def with_nonfinite_unrouted(inp, seed: int):
    """Masked and force-random tokens get NaN/inf logits: the kernel must not look at them."""
    g = generator(seed)
    unrouted = (~inp.routed).nonzero().reshape(-1)
    logits = inp.logits.clone()
    for n, t in enumerate(unrouted.tolist()):
        col = int(torch.randint(inp.logits.shape[1], (1,), generator=g))
        logits[t, col] = (float("nan"), float("inf"), float("-inf"))[n % 3]
    inp.logits = logits
    return inp


def check_bitwise(case: GateCase, inp, ep_rank: int, what: str, target: str = "cpu"):
    """Kernel vs reference, each with its own scores, bit for bit; returns the kernel's outputs."""
    idx, weights, unmapped, sc = run_kernel(case, inp, ep_rank, target=target)
    ref_idx, ref_w, ref_un, ref_sc = run_reference(case, inp, ep_rank)
    if sc is not None:
        assert_bitwise_equal(sc, ref_sc, f"{what} scores (0 for unrouted tokens)")
    assert_bitwise_equal(idx, ref_idx, f"{what} topk_idx")
    assert_bitwise_equal(weights, ref_w, f"{what} topk_weights")
    if unmapped is not None:
        assert_bitwise_equal(unmapped, ref_un, f"{what} unmapped_topk_idx")
    return idx, weights, unmapped, sc


@pytest.mark.parametrize(("case", "target"), on_targets(COVERING, SIM_COVERING, SIM_COVERING_SLOW))
def test_matches_reference(case: GateCase, target: str) -> None:
    block_m = gate_spec(case).block_m
    for seed, T in enumerate(counts_on(target, token_counts(block_m), block_m)):
        what = f"T={T}"
        inp = gate_inputs(case, T, seed, padded=min(T // 3, 10))
        inp = with_nonfinite_unrouted(inp, seed)
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):  # ascend-sim launches only
            idx, weights, unmapped, sc = check_bitwise(case, inp, EP_RANK, what, target)
        assert_scores_exact(sc, inp, case.flavor)
        assert_token_classes(case, inp, idx, weights, unmapped, sc)
        if case.fixed:
            fixed = inp.fixed
            if T >= 33:
                given = inp.options["unmapped_topk_idx"][fixed]
                assert bool((given[:, 0] == given[:, 1]).any()), "no fixed token with a duplicated expert"
            assert_bitwise_equal(unmapped[fixed], inp.options["unmapped_topk_idx"][fixed], f"{what} fixed experts")


@pytest.mark.parametrize("case", NO_SCORES, ids=lambda c: c.id)
def test_without_scores_output(case: GateCase) -> None:
    """Without the scores output, kernel vs reference end to end, on data with ties."""
    inp = gate_inputs(case, 300, 40, padded=10)
    idx, weights, unmapped, sc = check_bitwise(case, inp, EP_RANK, "no scores output")
    assert sc is None
    assert_token_classes(case, inp, idx, weights, unmapped, sc)


@pytest.mark.parametrize("case", NO_SCORES, ids=lambda c: c.id)
def test_scores_output_does_not_change_routing(case: GateCase) -> None:
    twin = GateCase(**{**case.__dict__, "scores": True})
    inp = gate_inputs(case, 300, 42, padded=10)
    idx, weights, unmapped, sc = run_kernel(case, inp, EP_RANK)
    assert sc is None
    idx2, weights2, unmapped2, _ = run_kernel(twin, inp, EP_RANK)
    assert_bitwise_equal(idx, idx2, "topk_idx")
    assert_bitwise_equal(weights, weights2, "topk_weights")
    if unmapped is not None:
        assert_bitwise_equal(unmapped, unmapped2, "unmapped_topk_idx")


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_tie_rows_follow_the_rule(flavor: str, target: str) -> None:
    """Equal logits give equal keys: the rank order is then fixed by the expert index."""
    case = PLAIN[flavor]
    logits = with_ties(torch.randn(60, case.E, generator=generator(43)), 44, every=1)
    inp = gate_inputs(case, 60, 45, logits=logits)
    idx, _, _, _ = check_bitwise(case, inp, 0, "ties", target)
    expect = tie_expectations(case.E, case.K)
    for t in range(60):
        kind = t % 6
        if kind in expect:
            lead = expect[kind]
            assert idx[t, :len(lead)].tolist() == lead, f"row {t} (tie kind {kind})"
        assert idx[t].unique().numel() == case.K, f"row {t}: an expert was taken twice"


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_zero_logits_route_to_the_first_experts(flavor: str, target: str) -> None:
    """Spec §5.8 (d) and §9.2: every score is sqrt(ln 2), keys tie, experts 0..K-1 in order, weights s/K."""
    case = PLAIN[flavor]
    inp = gate_inputs(case, 40, 46, logits=torch.zeros(40, case.E))
    idx, weights, _, sc = check_bitwise(case, inp, 0, "zero logits", target)
    assert_bitwise_equal(idx, torch.arange(case.K).expand(40, case.K).contiguous(), "experts 0..K-1")
    assert bool((sc == G0).all()), "sqrt(softplus(0)) must be fp32(sqrt(ln 2))"
    assert bool((weights == weights[0, 0]).all())
    assert abs(float(weights[0, 0]) - SCALE / case.K) <= 1e-6


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_extreme_logits(flavor: str, target: str) -> None:
    """Tails and the cuda threshold: 0 scores far left (ties at 0), x > 20 in cuda, huge finite logits."""
    case = PLAIN[flavor]
    values = torch.tensor([-3.4e38, -300.0, -207.0, -150.0, -100.0, -90.0, -87.0, -0.0, 0.0, 1e-30, 19.99, 20.0,
                           20.01, 50.0, 88.7, 89.0, 1e4, 1e30, 3.4e38])
    g = generator(47)
    logits = values[torch.randint(len(values), (64, case.E), generator=g)]
    logits[::4] = values[:7][torch.randint(7, (16, case.E), generator=g)]  # rows of (near-)zero scores only
    inp = gate_inputs(case, 64, 48, logits=logits)
    _, _, _, sc = check_bitwise(case, inp, 0, "extremes", target)
    assert_scores_exact(sc, inp, flavor)
    assert bool((sc[logits <= -3e38] == 0).all())


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_out_preallocated_and_determinism(flavor: str, target: str) -> None:
    """out= and repeated calls (on ascend-sim: three calls under three pipe schedules) give the same bits."""
    case = EVERYTHING[flavor]
    inp = gate_inputs(case, 300, 49, padded=10)
    with sim_schedule("consumers_first"):
        idx, weights, unmapped, sc = run_kernel(case, inp, EP_RANK, target=target)
    out = (torch.full_like(idx, 12345), torch.full_like(weights, float("nan")))
    with sim_schedule("producers_first"):
        idx2, weights2, unmapped2, sc2 = run_kernel(case, inp, EP_RANK, out=out, target=target)
    assert idx2 is out[0] and weights2 is out[1], "out= must be filled and returned"
    with sim_schedule("random"):
        idx3, weights3, unmapped3, sc3 = run_kernel(case, inp, EP_RANK, target=target)
    for what, (a, b, c) in {"topk_idx": (idx, idx2, idx3), "topk_weights": (weights, weights2, weights3),
                            "unmapped_topk_idx": (unmapped, unmapped2, unmapped3), "scores": (sc, sc2, sc3)}.items():
        assert_bitwise_equal(b, a, f"{what} with out=")
        assert_bitwise_equal(c, a, f"{what} second run")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_split_over_threads(flavor: str, vmi_env) -> None:
    """The replica choice and the random draws use the global token index, also when rows are split."""
    case = EVERYTHING[flavor]
    T = 1000
    vmi_env.setenv(THREADS_ENV, "3")
    assert len(row_ranges(T, 3, gate_spec(case).block_m, 256)) >= 2
    inp = gate_inputs(case, T, 50, padded=10)
    mp, count = inp.options["to_physical_map"], inp.options["logical_count"]
    for ep_rank in (0, 7660, 2**31 - 1):
        idx, weights, unmapped, sc = check_bitwise(case, inp, ep_rank, f"ep_rank={ep_rank}")
        # The shared slots' replicas from the formula, in Python integers.
        for t in inp.routed.nonzero().reshape(-1).tolist():
            for j in range(case.S):
                row = case.E + j
                dup = (ep_rank + t * 23333) % int(count[row])
                assert int(idx[t, case.K + j]) == int(mp[row, dup]), f"token {t}, shared slot {j}"
        vmi_env.setenv(THREADS_ENV, "1")
        idx1, weights1, _, _ = run_kernel(case, inp, ep_rank)
        vmi_env.setenv(THREADS_ENV, "3")
        assert_bitwise_equal(idx1, idx, "one thread: topk_idx")
        assert_bitwise_equal(weights1, weights, "one thread: topk_weights")
    assert len({tuple(r) for r in idx[inp.forced].tolist()}) > 1


@pytest.mark.parametrize("target", TARGETS)
def test_unmapped_with_a_row_stride(target: str) -> None:
    """unmapped_topk_idx may be a column slice of a wider tensor: read and written in place, neighbours kept."""
    case = EVERYTHING["ascend"]
    inp = gate_inputs(case, 100, 51, padded=5)
    wide = torch.randint(-5, case.E, (100, case.K + 3), generator=generator(52))
    wide[:, :case.K] = inp.options["unmapped_topk_idx"]
    before = wide.clone()
    view = wide[:, :case.K]
    assert not view.is_contiguous()
    idx, weights, unmapped, sc = run_kernel(case, inp, EP_RANK, unmapped_input=view, target=target)
    _, _, ref_un, _ = run_reference(case, inp, EP_RANK)
    assert_bitwise_equal(view, ref_un, "unmapped_topk_idx", check_stride=False)
    assert_bitwise_equal(wide[:, case.K:], before[:, case.K:], "columns beyond K")


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_weights_are_normalize_weight_of_the_selected_scores(flavor: str, target: str) -> None:
    """The gate's weights are normalize_weight (same flavor) of the selected scores, times the scale."""
    case = PLAIN[flavor]
    inp = gate_inputs(case, 300, 53)
    idx, weights, _, sc = run_kernel(case, inp, target=target)
    selected = sc.gather(1, idx).contiguous()
    _, normalized = normalize_weight(selected, target=target, flavor=flavor)
    assert_bitwise_equal(weights, normalized * torch.tensor(SCALE), "weights")


def test_entry_points_agree() -> None:
    case = EVERYTHING["ascend"]
    inp = gate_inputs(case, 200, 54, padded=10)
    idx, weights, unmapped, sc = run_kernel(case, inp, EP_RANK)
    for name, fn in (("moe_topk_gate", moe_topk_gate), ("parallel", moe_topk_gate_forward_parallel)):
        options = {**inp.options, "unmapped_topk_idx": inp.options["unmapped_topk_idx"].clone()}
        sc2 = torch.empty_like(sc)
        idx2, weights2 = fn(inp.logits, *positional(case, EP_RANK), scores=sc2, target="cpu", **options)
        assert_bitwise_equal(idx2, idx, f"{name} topk_idx")
        assert_bitwise_equal(weights2, weights, f"{name} topk_weights")
        assert_bitwise_equal(options["unmapped_topk_idx"], unmapped, f"{name} unmapped")
        assert_bitwise_equal(sc2, sc, f"{name} scores")
    # target "torch" runs the reference.
    options = {**inp.options, "unmapped_topk_idx": inp.options["unmapped_topk_idx"].clone()}
    sc_t = torch.empty_like(sc)
    idx_t, weights_t = moe_topk_gate_forward(inp.logits, *positional(case, EP_RANK), scores=sc_t, target="torch",
                                             **options)
    ref = run_reference(case, inp, EP_RANK)
    for what, a, b in zip(("topk_idx", "topk_weights", "unmapped", "scores"),
                          (idx_t, weights_t, options["unmapped_topk_idx"], sc_t), ref, strict=True):
        assert_bitwise_equal(a, b, f"torch target {what}")


def test_mask_of_any_shape_with_one_flag_per_token() -> None:
    case = COVERING[4]  # bias only, with a mask
    inp = gate_inputs(case, 64, 55)
    idx, weights, _, sc = run_kernel(case, inp)
    inp.options["mask"] = inp.options["mask"].reshape(8, 8)
    idx2, weights2, _, sc2 = run_kernel(case, inp)
    assert_bitwise_equal(idx2, idx)
    assert_bitwise_equal(weights2, weights)


# --- slow sweeps ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", [*EVERYTHING.values(), *NO_SCORES[:1]], ids=lambda c: c.id)
def test_many_tokens(case: GateCase) -> None:
    inp = gate_inputs(case, 16384 + 5, 60, padded=10)
    idx, weights, unmapped, sc = check_bitwise(case, inp, EP_RANK, "T=16389")
    assert_token_classes(case, inp, idx, weights, unmapped, sc)
    plain = gate_inputs(case, 16384, 61, ties=False)
    check_bitwise(case, plain, EP_RANK, "T=16384 without constructed ties")


@pytest.mark.slow
def test_token_index_past_int32_replica_overflow() -> None:
    """ep_rank + t * 23333 exceeds int32 from t = 92037 (spec §11.2): the replica choice must not wrap."""
    case = GateCase(16, 6, S=2, dup=3, flavor="ascend", force=True)
    inp = gate_inputs(case, 100_000, 63)
    check_bitwise(case, inp, 2**31 - 1, "T=100000")


FLAG_NAMES = ("mask", "bias", "image", "fixed", "force", "dup")
PRODUCT = [
    GateCase(72, 6, S=1, flavor=flavor, **{n: v for n, v in zip(FLAG_NAMES, flags, strict=True) if n != "dup"},
             dup=3 if flags[-1] else 0)
    for flavor in FLAVORS for flags in itertools.product((False, True), repeat=len(FLAG_NAMES))
]


@pytest.mark.slow
@pytest.mark.parametrize("case", PRODUCT, ids=lambda c: c.id)
def test_option_product(case: GateCase) -> None:
    inp = with_nonfinite_unrouted(gate_inputs(case, 257, 64, padded=10), 65)
    idx, weights, unmapped, sc = check_bitwise(case, inp, EP_RANK, "product")
    assert_scores_exact(sc, inp, case.flavor)
    assert_token_classes(case, inp, idx, weights, unmapped, sc)


# Spec §5.8's (E, S, K) list.
SPEC_SIZES = [(72, 1, 6), (32, 2, 6), (64, 2, 6), (96, 2, 6), (16, 2, 6), (36, 2, 6), (108, 2, 6), (128, 2, 6),
              (144, 2, 6), (256, 2, 8)]


@pytest.mark.slow
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize(("E", "S", "K"), SPEC_SIZES, ids=[f"E{e}-S{s}-K{k}" for e, s, k in SPEC_SIZES])
def test_spec_sizes(E: int, S: int, K: int, flavor: str) -> None:
    case = GateCase(E, K, S=S, dup=3, flavor=flavor, **ALL)
    inp = gate_inputs(case, 8001 + 10, 66, padded=10)
    idx, weights, unmapped, sc = check_bitwise(case, inp, 0, "spec sizes")
    assert_scores_exact(sc, inp, flavor)
    assert_token_classes(case, inp, idx, weights, unmapped, sc)
