"""The gate with autograd (``moe_topk_gate_autograd``, a custom op with a registered backward) on the cpu target
(and, in the slow run, on ascend-sim).

* ``loss.backward()`` gives ``logits.grad`` bit for bit equal to a direct
  ``moe_topk_gate_backward`` call on the saved quantities, recomputed with the forward
  (``scores=``, ``unmapped_topk_idx=``): the routed weights' gradient, and with
  ``num_sequences`` the ``scores_sum`` gradient as the auxiliary term over the routed tokens;
* only the weights and ``scores_sum`` carry gradients; shared-expert slots carry none;
  masked and force-random tokens get +0.0 rows;
* ``sequence_score_sums`` against a float64 computation, within the rounding bound of its
  sums of positive terms;
* end to end against ``torch.autograd`` of a pure float64 gate with the same (fixed)
  selection: ``w = s y_sel / (sum y_sel + 1e-20)`` and the per-sequence sums of
  ``y / sum(y)``, ``y = sqrt(softplus(x))``;
* bad ``num_sequences`` and ``scoring_func`` raise before anything runs.

Inputs: 72 experts, top 6, bias, padded tokens at the tail of every sequence, fixed
routing with duplicated experts and force-random tokens.
"""

from dataclasses import dataclass

import pytest
import torch

from vmi_core.tools.testing import assert_bitwise_equal, generator
from vmi_devkit.errors import no_kernel_fixture
from vmi_moe import moe_topk_gate_autograd, moe_topk_gate_backward, moe_topk_gate_forward
from vmi_moe.autograd import sequence_score_sums

E, K, SCALE = 72, 6, 1.5
UNIT = 2.0**-24  # fp32 unit roundoff


@dataclass
class Problem:
    logits: torch.Tensor
    mask: torch.Tensor
    bias: torch.Tensor
    fixed: torch.Tensor
    given: torch.Tensor  # fixed experts (duplicates included); the forward overwrites its copy
    force: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.logits.shape[0]

    def options(self) -> dict:
        return {"mask": self.mask, "bias": self.bias, "fix_routing_mask": self.fixed,
                "unmapped_topk_idx": self.given.clone(), "force_random": self.force}

    @property
    def in_statistic(self) -> torch.Tensor:
        """Tokens in ``scores_sum``: routed ones (neither masked nor force-random)."""
        return self.mask & ~self.force


def problem(num_tokens: int, num_seqs: int, seed: int) -> Problem:
    g = generator(seed)
    mask = torch.ones(num_tokens, dtype=torch.bool)
    tokens_per_seq = num_tokens // num_seqs
    pad = tokens_per_seq // 6
    for seq in range(num_seqs if pad else 0):
        mask[(seq + 1) * tokens_per_seq - pad:(seq + 1) * tokens_per_seq] = False
    given = torch.randint(0, E, (num_tokens, K), generator=g)
    given[1::3, 1] = given[1::3, 0]
    return Problem(torch.randn(num_tokens, E, generator=g) * 2.0, mask, torch.randn(E, generator=g) * 0.5,
                   torch.rand(num_tokens, generator=g) < 0.3, given, torch.rand(num_tokens, generator=g) < 0.1)


def saved_quantities(prob: Problem, target: str = "cpu", num_shared: int = 0):
    """``(topk_idx, topk_weights, scores, unmapped)`` of the forward on ``prob``."""
    scores = torch.empty_like(prob.logits)
    options = prob.options()
    idx, weights = moe_topk_gate_forward(prob.logits, K, num_shared > 0, num_shared, SCALE, 0, **options,
                                         scores=scores, target=target)
    return idx, weights, scores, options["unmapped_topk_idx"]


def autograd_gate(prob: Problem, num_sequences=None, target: str = "cpu", num_shared: int = 0):
    logits = prob.logits.clone().requires_grad_(True)
    outputs = moe_topk_gate_autograd(logits, K, num_shared > 0, num_shared, SCALE, 0, **prob.options(),
                                     num_sequences=num_sequences, target=target)
    return logits, outputs


def direct_backward(prob: Problem, grad_weights, grad_scores_sum=None, target: str = "cpu") -> torch.Tensor:
    _, weights, scores, unmapped = saved_quantities(prob, target)
    aux = {} if grad_scores_sum is None else {"mask": prob.in_statistic, "grad_scores_sum": grad_scores_sum}
    return moe_topk_gate_backward(scores, unmapped, weights[:, :K].contiguous(), grad_weights, SCALE, **aux,
                                  target=target)


def assert_positive_zero_rows(grad: torch.Tensor, rows: torch.Tensor) -> None:
    assert bool(rows.any())
    assert bool((grad[rows].view(torch.int32) == 0).all()), "masked/force-random rows are not all +0.0"


# ascend-sim (forward and backward as the ascend target emits them) lowers two kernels of its own: slow.
@pytest.mark.parametrize(("num_sequences", "target"),
                         [(None, "cpu"), (3, "cpu"), (111, "cpu"), (3, "torch"),
                          pytest.param(3, "ascend-sim", marks=pytest.mark.slow)])
def test_grad_equals_the_direct_backward(num_sequences, target: str) -> None:
    prob = problem(111, num_sequences or 3, 1)
    g = generator(2)
    grad_weights = torch.randn(111, K, generator=g)
    logits, outputs = autograd_gate(prob, num_sequences, target)
    idx, weights = outputs[:2]
    loss = (weights * grad_weights).sum()
    grad_scores_sum = None
    if num_sequences is not None:
        assert len(outputs) == 3
        grad_scores_sum = torch.randn(num_sequences, E, generator=g)
        loss = loss + (outputs[2] * grad_scores_sum).sum()
    else:
        assert len(outputs) == 2
    loss.backward()

    ref_idx, ref_weights, scores, _ = saved_quantities(prob, target)
    assert_bitwise_equal(idx, ref_idx, "topk_idx")
    assert_bitwise_equal(weights.detach(), ref_weights, "topk_weights")
    if num_sequences is not None:
        assert_bitwise_equal(outputs[2].detach(), sequence_score_sums(scores, prob.in_statistic, num_sequences),
                             "scores_sum")
    expected = direct_backward(prob, grad_weights, grad_scores_sum, target)
    assert_bitwise_equal(logits.grad, expected, "logits.grad")
    assert_positive_zero_rows(logits.grad, ~prob.in_statistic)


def test_gradient_flows_only_through_weights_and_scores_sum() -> None:
    prob = problem(111, 3, 3)
    g = generator(4)
    grad_weights, grad_scores_sum = torch.randn(111, K, generator=g), torch.randn(3, E, generator=g)
    logits, (idx, weights, scores_sum) = autograd_gate(prob, 3)
    assert not idx.requires_grad and idx.grad_fn is None
    assert weights.requires_grad and scores_sum.requires_grad
    # scores_sum alone: no route term.
    (scores_sum * grad_scores_sum).sum().backward()
    assert_bitwise_equal(logits.grad, direct_backward(prob, torch.zeros(111, K), grad_scores_sum), "scores_sum only")
    # The weights alone: the auxiliary term with a zero upstream gradient.
    logits, (_, weights, _) = autograd_gate(prob, 3)
    (weights * grad_weights).sum().backward()
    assert_bitwise_equal(logits.grad, direct_backward(prob, grad_weights, torch.zeros(3, E)), "weights only")
    # No num_sequences: the same route gradient without the auxiliary term.
    logits_plain, (_, weights_plain) = autograd_gate(prob)
    (weights_plain * grad_weights).sum().backward()
    assert_bitwise_equal(logits_plain.grad, direct_backward(prob, grad_weights), "no aux")
    # A zero h adds +0.0 to every route value.
    assert_bitwise_equal(logits.grad, logits_plain.grad, "zero h vs no aux")


def test_shared_slot_gradients_are_ignored() -> None:
    prob = problem(64, 2, 5)
    g = generator(6)
    grad_weights = torch.randn(64, K + 1, generator=g)
    logits, (idx, weights) = autograd_gate(prob, num_shared=1)
    routed = prob.in_statistic
    assert weights.shape == (64, K + 1) and bool((weights[routed, K] == 1.0).all())
    assert bool((idx[routed, K] == E).all())
    (weights * grad_weights).sum().backward()
    logits_routed, (_, weights_routed) = autograd_gate(prob, num_shared=1)
    only_routed = grad_weights.clone()
    only_routed[:, K] = 0.0
    (weights_routed * only_routed).sum().backward()
    assert_bitwise_equal(logits.grad, logits_routed.grad, "shared-slot gradient")
    assert_bitwise_equal(logits.grad, direct_backward(prob, grad_weights[:, :K].contiguous()), "direct")


def score_sums_f64(scores: torch.Tensor, mask: torch.Tensor | None, num_seqs: int) -> torch.Tensor:
    """Per-sequence sums of ``u / sum(u)`` over tokens in ``mask``, token by token in float64."""
    num_tokens, num_experts = scores.shape
    tokens_per_seq = num_tokens // num_seqs
    sums = torch.zeros(num_seqs, num_experts, dtype=torch.float64)
    for t in range(num_tokens):
        row = scores[t].double()
        if (mask is None or bool(mask[t])) and float(row.sum()) > 0:
            sums[t // tokens_per_seq] += row / row.sum()
    return sums


@pytest.mark.parametrize("num_seqs", [1, 3, 111])
@pytest.mark.parametrize("with_mask", [True, False])
def test_sequence_score_sums(num_seqs: int, with_mask: bool) -> None:
    """Each share is an fp32 sum of E positive terms and one division, each sequence sum adds
    ``tokens_per_seq`` positive shares: within ``(E + tokens_per_seq + 2) u`` of the float64
    value, relative to it. Zero rows (masked tokens) contribute nothing, not NaN."""
    prob = problem(111, num_seqs, 7)
    _, _, scores, _ = saved_quantities(prob)
    assert bool((scores[~prob.in_statistic] == 0).all())
    mask = prob.in_statistic if with_mask else None
    got = sequence_score_sums(scores, mask, num_seqs)
    expected = score_sums_f64(scores, mask, num_seqs)
    assert got.dtype == torch.float32 and got.shape == (num_seqs, E)
    bound = (E + 111 // num_seqs + 2) * UNIT * expected
    err = (got.double() - expected).abs()
    assert bool((err <= bound).all()), f"worst ratio {(err / bound.clamp_min(1e-300)).max().item():.3g}"
    # Each token's shares sum to 1: the sequence rows sum to the number of counted tokens, up to the
    # fp32 rounding of E quotients and of the sums (E + tokens per sequence) * 2^-24 <= 1e-5 here.
    counted = torch.ones(111, dtype=torch.bool) if mask is None else mask
    counted = counted & (scores.sum(dim=1) > 0)
    per_seq = counted.reshape(num_seqs, -1).sum(dim=1).double()
    torch.testing.assert_close(got.double().sum(dim=1), per_seq, rtol=1e-5, atol=0.0)


def sqrt_softplus_f64(x: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(torch.relu(x) + torch.log1p(torch.exp(-x.abs())))


@pytest.mark.parametrize("num_sequences", [None, 3])
def test_end_to_end_against_float64_autograd(num_sequences) -> None:
    """The kernels against ``torch.autograd`` of a pure float64 gate with the kernel's selection.

    The kernel works from fp32 scores and weights (each within a few ulp of the float64
    values); measured: the gradients differ by at most ~2e-7 of the largest one."""
    num_tokens = 24
    prob = problem(num_tokens, 3, 8)
    g = generator(9)
    grad_weights = torch.randn(num_tokens, K, generator=g, dtype=torch.float64)
    grad_scores_sum = torch.randn(3, E, generator=g, dtype=torch.float64)

    logits, outputs = autograd_gate(prob, num_sequences)
    loss = (outputs[1] * grad_weights.float()).sum()
    if num_sequences is not None:
        loss = loss + (outputs[2] * grad_scores_sum.float()).sum()
    loss.backward()

    _, _, _, unmapped = saved_quantities(prob)
    x = prob.logits.double().requires_grad_(True)
    y = sqrt_softplus_f64(x)
    valid = unmapped >= 0
    y_sel = torch.where(valid, y.gather(1, unmapped.clamp(min=0)), 0.0)
    w = SCALE * y_sel / (y_sel.sum(dim=1, keepdim=True) + 1e-20)
    loss64 = (torch.where(valid, grad_weights, 0.0) * w).sum()
    if num_sequences is not None:
        share = torch.where(prob.in_statistic[:, None], y / y.sum(dim=1, keepdim=True), 0.0)
        loss64 = loss64 + (grad_scores_sum * share.reshape(3, -1, E).sum(dim=1)).sum()
    (expected,) = torch.autograd.grad(loss64, x)

    # The pure gate reproduces the kernel's weights of the routed tokens: the float64 gate differs
    # only by the kernel's fp32 roundings (score <= 2 ulp, K-term sum, quotient, scale), < 1e-6.
    routed = prob.in_statistic
    torch.testing.assert_close(outputs[1].detach()[routed].double(), w.detach()[routed], rtol=1e-6, atol=0.0)
    got = logits.grad.double()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert_positive_zero_rows(logits.grad, ~prob.in_statistic)


no_kernel = no_kernel_fixture("vmi_moe.kernels.moe_topk_gate", "vmi_moe.kernels.moe_topk_gate_backward", autouse=False)


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("num_sequences", "error", "match"), [
    (0, ValueError, "num_sequences must be >= 1 and divide the number of tokens"),
    (-3, ValueError, "num_sequences must be >= 1"),
    (5, ValueError, r"divide the number of tokens \(12\), got 5"),
    (24, ValueError, "divide the number of tokens"),
    (True, TypeError, "num_sequences must be an int"),
    (2.0, TypeError, "num_sequences must be an int"),
    ("3", TypeError, "num_sequences must be an int"),
])
def test_bad_num_sequences(num_sequences, error, match) -> None:
    logits = torch.randn(12, E, requires_grad=True)
    with pytest.raises(error, match=match):
        moe_topk_gate_autograd(logits, K, False, 0, SCALE, 0, num_sequences=num_sequences, target="cpu")


@pytest.mark.usefixtures("no_kernel")
def test_bad_scoring_func_and_logits() -> None:
    logits = torch.randn(12, E, requires_grad=True)
    with pytest.raises(ValueError, match="scoring_func must be 'sqrtsoftplus'"):
        moe_topk_gate_autograd(logits, K, False, 0, SCALE, 0, "softmax", target="cpu")
    with pytest.raises(ValueError, match="logits must be a 2-D tensor"):
        moe_topk_gate_autograd(logits[0], K, False, 0, SCALE, 0, num_sequences=1, target="cpu")


def test_second_derivative_raises_naming_the_op() -> None:
    """``grad(weights.sum(), create_graph=True)`` gives the first-order gradient; differentiating it
    raises instead of giving zeros (the backward kernel has no derivative)."""
    prob = problem(111, 3, 5)
    logits, (_, weights) = autograd_gate(prob, target="torch")
    (grad,) = torch.autograd.grad(weights.sum(), logits, create_graph=True)
    assert grad.requires_grad
    logits_plain, (_, weights_plain) = autograd_gate(prob, target="torch")
    assert_bitwise_equal(grad.detach(), torch.autograd.grad(weights_plain.sum(), logits_plain)[0], "first order")
    with pytest.raises(RuntimeError, match="moe_topk_gate_autograd has no second derivative"):
        torch.autograd.grad(grad.sum(), logits, allow_unused=True)
