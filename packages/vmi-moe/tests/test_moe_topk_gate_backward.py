"""moe_topk_gate_backward on the cpu target (both flavors) and on ascend-sim (the ascend flavor, its
only one) against the float64 reference.

The inputs come from the cpu forward kernel (``scores=``, ``unmapped_topk_idx=``): biased
routing, fixed routing with duplicated experts (some rows with one expert in every slot),
force-random tokens and padded tokens at the tail of every sequence; some routed tokens
also stay out of the auxiliary statistic. Each ``GateBackwardSpec`` (E, K, flavor, aux) is
one compiled kernel; the token count, the number of sequences and the tokens per sequence
are runtime values, so one case runs several of them: no token, one token, sequences whose
boundaries fall inside a work tile (``GateBackwardSpec.block_m`` rows) and one token per sequence.

Results are checked against the reference with the spec's tolerance (§6.8) and with an
element-wise worst-case bound on the fp32 rounding of the kernel's steps (``rounding_bound``):
4 to 7 times tighter than the spec's at the largest elements, about 20 times at typical
ones, and exact where the gradient must be exactly zero.
Padded, masked and force-random rows must be +0.0 bit for bit; ``out=``, repeated calls and
thread splits must not change a bit. The worked examples of spec §9.4 and §9.5 are
checked against values written down from the formulas.

On ascend-sim (the emitted AscendC on vmi-core's model of the vector core) the same criteria
run on ``SIM_CASES``, with two more token counts of more than two work tiles per simulated
core (``sim_sizes``), the pipe schedule cycling over ``SIM_SCHEDULES`` from one size to the
next, and the padded-row and sequence-row checks run there with the aux term; the inputs
still come from the cpu forward. Each kernel is lowered anew per test process, so the other
ascend cases and checks run on ascend-sim in the slow run.
"""

import math

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, cpu_threads, row_ranges
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_backward_cases import (
    CASES,
    FULL_CASES,
    SCALE,
    SIM_CASES,
    Case,
    GateData,
    assert_matches_reference,
    assert_positive_zero_rows,
    dscore,
    gate_data,
    rounding_bound,
    run,
    sim_sizes,
    sizes,
    spec_of,
)
from vmi_devkit.cases.moe_cases import SIM, flavor_targets
from vmi_devkit.errors import forbid_kernels
from vmi_moe import moe_topk_gate_backward, moe_topk_gate_backward_parallel, moe_topk_gate_forward
from vmi_moe.reference import moe_topk_gate_backward as reference_backward


@pytest.mark.parametrize(("case", "target"), [*(pytest.param(c, "cpu", id=f"{c}-cpu") for c in CASES),
                                               *(pytest.param(c, SIM, id=f"{c}-{SIM}",
                                                              marks=[] if c in SIM_CASES else [pytest.mark.slow])
                                                 for c in CASES if c.flavor == "ascend")])
def test_matches_reference(case: Case, target: str) -> None:
    for seed, (num_tokens, num_seqs) in enumerate(sizes(case) if target == "cpu" else sim_sizes(case)):
        data = gate_data(case, num_tokens, num_seqs, seed)
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):  # ascend-sim launches only
            got = run(case, data, target)
        label = f"{case} T={num_tokens} Nseq={num_seqs}"
        assert_matches_reference(got, data.args(), data.aux(case), label)
        assert_positive_zero_rows(got, data.dead, label)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL_CASES, ids=str)
def test_matches_reference_full(case: Case) -> None:
    for seed, (num_tokens, num_seqs) in enumerate(sizes(case) + [(1001, 7)]):
        data = gate_data(case, num_tokens, num_seqs, seed)
        assert_matches_reference(run(case, data), data.args(), data.aux(case), f"{case} T={num_tokens}")


@pytest.mark.slow
@pytest.mark.parametrize("case", [Case(256, 8, "ascend", True), Case(72, 6, "cuda", True)], ids=str)
def test_large_token_count(case: Case) -> None:
    # Two sequences of 8192 + 10 tokens (the spec's 8001 plus padding, rounded past 2^14 in total).
    data = gate_data(case, 2 * 8202, 2, 5)
    got = run(case, data)
    assert_matches_reference(got, data.args(), data.aux(case), str(case))
    assert_positive_zero_rows(got, data.dead, str(case))


@pytest.mark.parametrize(("flavor", "target", "aux"),
                         [*((flavor, "cpu", aux) for flavor in ("ascend", "cuda") for aux in (False, True)),
                          ("ascend", SIM, True), pytest.param("ascend", SIM, False, marks=pytest.mark.slow)])
def test_padded_rows_are_positive_zero_with_negative_h(flavor: str, target: str, aux: bool) -> None:
    # A negative h times the zero 1/U of a padded token is -0.0; the row must still come out +0.0.
    case = Case(72, 6, flavor, aux)
    data = gate_data(case, 3 * 37, 3, 11)
    data.h = -(torch.rand(3, 72, generator=generator(12)) + 0.5)
    got = run(case, data, target)
    assert bool(data.dead.sum() >= 3)
    assert_positive_zero_rows(got, data.dead, str(case))
    assert_matches_reference(got, data.args(), data.aux(case), str(case))


@pytest.mark.parametrize(("flavor", "target", "num_seqs"),
                         [*((flavor, "cpu", n) for flavor in ("ascend", "cuda") for n in (1, 3, 67)),
                          ("ascend", SIM, 67),
                          *(pytest.param("ascend", SIM, n, marks=pytest.mark.slow) for n in (1, 3))])
def test_each_token_reads_its_own_sequence_row(flavor: str, target: str, num_seqs: int) -> None:
    """h of sequence s is zero but for a large value at its own column ``7s mod E``: for a
    token of that sequence in the statistic and without upstream weight gradients, exactly
    that column is positive and all others negative. Sequences of 67 tokens (boundaries
    inside work tiles) and of one token (a tile spans many sequences)."""
    case = Case(72, 6, flavor, True)
    num_tokens = 67 * 3 if num_seqs == 3 else 67
    data = gate_data(case, num_tokens, num_seqs, 20 + num_seqs)
    data.grad = torch.zeros_like(data.grad)
    columns = [7 * seq % 72 for seq in range(num_seqs)]
    data.h = torch.zeros(num_seqs, 72)
    for seq, col in enumerate(columns):
        data.h[seq, col] = 10.0 ** (seq % 5) * (seq + 1)
    got = run(case, data, target)
    assert_matches_reference(got, data.args(), data.aux(case), str(case))
    tokens_per_seq = num_tokens // num_seqs
    for t in data.mask.nonzero().flatten().tolist():
        positive = (got[t] > 0).nonzero().flatten().tolist()
        assert positive == [columns[t // tokens_per_seq]], f"token {t}: positive columns {positive}"
        assert int((got[t] < 0).sum()) == 71, f"token {t}"
    assert_positive_zero_rows(got, ~data.mask, str(case))


@pytest.mark.parametrize("num_seqs", [8, 1200])
def test_rows_split_across_threads(vmi_env, num_seqs: int) -> None:
    """1200 tokens over three threads (ranges start at multiples of the work tile, inside
    sequences) give the single-thread bits; each thread's kernel gets its row offset."""
    case = Case(72, 6, "ascend", True)
    data = gate_data(case, 1200, num_seqs, 30)
    vmi_env.setenv(THREADS_ENV, "3")
    starts = [start for start, _ in row_ranges(1200, cpu_threads(), spec_of(case).block_m, 256)[1:]]
    assert starts, "no thread split"
    assert num_seqs == 1200 or any(start % (1200 // num_seqs) for start in starts)
    split = run(case, data)
    vmi_env.setenv(THREADS_ENV, "1")
    single = run(case, data)
    assert_bitwise_equal(split, single, "3 threads vs 1")
    assert_matches_reference(split, data.args(), data.aux(case), f"Nseq={num_seqs}")


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_out_tensor_determinism_and_entry_points(flavor: str) -> None:
    case = Case(72, 6, flavor, True)
    data = gate_data(case, 3 * 37, 3, 40)
    fresh = run(case, data)
    out = torch.full_like(data.scores, float("nan"))
    returned = run(case, data, out=out)
    assert returned is out
    assert_bitwise_equal(out, fresh, "out=")
    assert_bitwise_equal(run(case, data), fresh, "second call")
    parallel = moe_topk_gate_backward_parallel(*data.args(), **data.aux(case), target="cpu", flavor=flavor)
    assert_bitwise_equal(parallel, fresh, "_parallel entry")
    torch_target = moe_topk_gate_backward(*data.args(), **data.aux(case), target="torch", flavor=flavor)
    assert_bitwise_equal(torch_target, reference_backward(*data.args(), **data.aux(case)), "target='torch'")


def test_no_tokens_launch_nothing(monkeypatch) -> None:
    forbid_kernels(monkeypatch, "vmi_moe.kernels.moe_topk_gate_backward", why="zero tokens")
    empty = (torch.zeros(0, 72), torch.zeros(0, 6, dtype=torch.int64), torch.zeros(0, 6), torch.zeros(0, 6), SCALE)
    for aux in ({}, {"mask": torch.zeros(0, dtype=torch.bool), "grad_scores_sum": torch.zeros(2, 72)}):
        got = moe_topk_gate_backward(*empty, **aux, target="cpu")
        assert got.shape == (0, 72) and got.dtype == torch.float32


def dydx(y: float) -> float:
    return -math.expm1(-y * y) / (2.0 * y)


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_worked_examples(flavor: str, target: str) -> None:
    """Spec §9.4 and §9.5, padded to 72 experts with zero scores (which change no sum and get y' = 0).

    Token 0: route example (experts 1, 2); token 1: fixed routing [1, 1], whose slot terms
    -0.125 and 0.125 are exact and cancel; token 2: the aux example h = [1, -1]; token 3:
    uniform h, whose aux term is exactly 0 in both flavors' rounding. One token per sequence.
    """
    E, K = 72, 6
    scores = torch.zeros(4, E)
    scores[0, :4] = torch.tensor([1.0, 3.0, 2.0, 0.5])
    scores[1, :4] = torch.tensor([1.0, 3.0, 2.0, 0.5])
    scores[2, :2] = torch.tensor([1.0, 3.0])
    scores[3, :2] = torch.tensor([1.0, 3.0])
    idx = torch.full((4, K), -1, dtype=torch.int64)
    idx[0, :2] = torch.tensor([1, 2])
    idx[1, :2] = torch.tensor([1, 1])
    weights, grad = torch.zeros(4, K), torch.zeros(4, K)
    weights[0, :2], grad[0, :2] = torch.tensor([0.9, 0.6]), torch.tensor([1.0, -1.0])
    weights[1, :2], grad[1, :2] = torch.tensor([0.75, 0.75]), torch.tensor([1.0, 2.0])
    h = torch.zeros(4, E)
    h[:, :2] = torch.tensor([[5.0, 7.0], [5.0, 7.0], [1.0, -1.0], [0.5, 0.5]])
    h[3, 2:] = 0.5
    mask = torch.tensor([False, False, True, True])
    args = (scores, idx, weights, grad, SCALE)
    for aux in ({}, {"mask": mask, "grad_scores_sum": h}):
        got = moe_topk_gate_backward(*args, **aux, target=target, flavor=flavor)
        expected = torch.zeros(4, E)
        expected[0, 1], expected[0, 2] = 0.24 * dydx(3.0), -0.36 * dydx(2.0)
        assert expected[0, 1].item() == pytest.approx(0.0399951, abs=1e-7)
        assert expected[0, 2].item() == pytest.approx(-0.0883516, abs=1e-7)
        if aux:
            expected[2, 0], expected[2, 1] = 0.375 * dydx(1.0), -0.125 * dydx(3.0)
        # Exact zeros everywhere else (the cancellations included); the rest within y''s 1.5e-7 plus the
        # fp32 rounding of the inputs 0.9 and 0.6.
        zero = expected == 0
        assert_bitwise_equal(got[zero], torch.zeros(int(zero.sum())), f"zeros aux={bool(aux)}")
        torch.testing.assert_close(got[~zero], expected[~zero], rtol=5e-7, atol=0.0)


@pytest.mark.parametrize("target", ["cpu", pytest.param(SIM, marks=pytest.mark.slow)])
def test_duplicated_expert_in_every_slot_cancels(target: str) -> None:
    """Fixed routing with one expert in all K slots: every weight is ``s u / (K u)``, a
    constant, so the route gradient is zero up to rounding (and exactly zero elsewhere)."""
    case = Case(72, 6, "ascend", False)
    g = generator(50)
    num_tokens = 40
    logits = torch.randn(num_tokens, 72, generator=g) * 2.0
    expert = torch.randint(0, 72, (num_tokens, 1), generator=g)
    unmapped = expert.repeat(1, 6)
    scores = torch.empty(num_tokens, 72)
    _, weights = moe_topk_gate_forward(logits, 6, False, 0, SCALE, 0, mask=torch.ones(num_tokens, dtype=torch.bool),
                                       bias=torch.zeros(72), fix_routing_mask=torch.ones(num_tokens, dtype=torch.bool),
                                       unmapped_topk_idx=unmapped,
                                       force_random=torch.zeros(num_tokens, dtype=torch.bool), scores=scores,
                                       target="cpu")
    assert bool((unmapped == expert).all())
    grad = torch.randn(num_tokens, 6, generator=g)
    data = GateData(scores, unmapped, weights[:, :6].contiguous(), grad, None, None, None)
    got = run(case, data, target)
    others = torch.ones_like(got, dtype=torch.bool).scatter_(1, expert, False)
    assert_bitwise_equal(got[others], torch.zeros(int(others.sum())), "columns of other experts")
    # Without cancellation the column would be y' * sum_j |s g_j| / D, around 0.1 to 1.
    at_expert = got.gather(1, expert).abs().double()
    scale = dscore(scores.double().gather(1, expert)) * (SCALE * grad.abs().double().sum(1, keepdim=True)
                                                         / (6 * scores.double().gather(1, expert)))
    assert bool((at_expert <= 2.0**-18 * scale).all()), f"largest ratio {(at_expert / scale).max().item():.3g}"
    # The reference is zero up to fp64 rounding: no scale for the spec's tolerance, only the bound.
    assert_matches_reference(got, data.args(), {}, "all slots one expert", spec_tolerance=False)


def test_bound_rejects_a_wrong_sequence_row() -> None:
    """The checker can fail: the reference computed with every token on its neighbour
    sequence's row of h is outside the rounding bound (and the spec tolerance)."""
    g = generator(60)
    num_tokens, num_seqs, E, K = 24, 3, 16, 4
    scores = torch.rand(num_tokens, E, generator=g) + 0.2
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(num_tokens)])
    weights, grad = torch.rand(num_tokens, K, generator=g), torch.randn(num_tokens, K, generator=g)
    aux = {"mask": torch.ones(num_tokens, dtype=torch.bool), "grad_scores_sum": torch.randn(num_seqs, E, generator=g)}
    args = (scores, idx, weights, grad, SCALE)
    wrong = reference_backward(*args, mask=aux["mask"], grad_scores_sum=aux["grad_scores_sum"].roll(1, dims=0))
    with pytest.raises(AssertionError):
        assert_matches_reference(wrong, args, aux, "rolled h")
    # A change the spec's tolerance lets through (1e-6 of the largest element, at the element
    # with the smallest bound) is caught by the element-wise bound.
    right = reference_backward(*args, **aux)
    assert_matches_reference(right, args, aux, "itself")
    bound = rounding_bound(*args[:4], **aux)
    t, e = divmod(int(bound.argmin()), E)
    nudged = right.clone()
    nudged[t, e] += 1e-6 * right.abs().max()
    torch.testing.assert_close(nudged, right, rtol=1e-5, atol=1e-5 * right.abs().max().item())
    with pytest.raises(AssertionError, match="rounding bound"):
        assert_matches_reference(nudged, args, aux, "nudged")
