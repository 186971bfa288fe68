"""The gate backward reference: worked examples, exact zeros of padded tokens, and float64 autograd."""

import math

import pytest
import torch

from vmi_core.tools.testing import assert_bitwise_equal
from vmi_moe.reference import moe_topk_gate_backward
from vmi_moe.reference.backward import _backward_f64


def dydx(y: float) -> float:
    return (1.0 - math.exp(-y * y)) / (2.0 * y)


def i64(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def test_route_gradient_worked_example() -> None:
    scores = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    grad = moe_topk_gate_backward(scores, i64([[1, 2]]), torch.tensor([[0.9, 0.6]]), torch.tensor([[1.0, -1.0]]), 1.5)
    assert grad.dtype == torch.float32
    expected = [0.0, 0.24 * dydx(3.0), -0.36 * dydx(2.0), 0.0]
    assert expected[1] == pytest.approx(0.0399951, abs=1e-7)
    assert expected[2] == pytest.approx(-0.0883516, abs=1e-7)
    assert grad[0].tolist() == pytest.approx(expected, rel=1e-6, abs=0.0)


def test_route_gradient_of_duplicates_cancels() -> None:
    scores = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    grad = moe_topk_gate_backward(scores, i64([[1, 1]]), torch.tensor([[0.75, 0.75]]), torch.tensor([[1.0, 2.0]]), 1.5)
    assert_bitwise_equal(grad, torch.zeros(1, 4))


def test_aux_gradient_worked_example() -> None:
    scores = torch.tensor([[1.0, 3.0]])
    no_route = (i64([[-1]]), torch.zeros(1, 1), torch.tensor([[5.0]]), 1.5)
    grad = moe_topk_gate_backward(scores, *no_route, mask=torch.tensor([True]),
                                  grad_scores_sum=torch.tensor([[1.0, -1.0]]))
    assert grad[0].tolist() == pytest.approx([0.375 * dydx(1.0), -0.125 * dydx(3.0)], rel=1e-6, abs=0.0)
    uniform = moe_topk_gate_backward(scores, *no_route, mask=torch.tensor([True]),
                                     grad_scores_sum=torch.tensor([[0.5, 0.5]]))
    assert_bitwise_equal(uniform, torch.zeros(1, 2))


@pytest.mark.parametrize("aux", [False, True])
def test_padded_tokens_give_positive_zeros(aux: bool) -> None:
    g = torch.Generator().manual_seed(4)
    num_tokens, num_experts, k = 6, 8, 3
    scores = torch.rand(num_tokens, num_experts, generator=g) + 0.1
    topk_idx = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(num_tokens)])
    weights = torch.rand(num_tokens, k, generator=g)
    grad_w = torch.randn(num_tokens, k, generator=g)
    padded = torch.tensor([False, False, True, False, True, True])
    scores[padded] = 0.0
    topk_idx[padded] = -1
    weights[padded] = 0.0
    extra = {}
    if aux:
        # Negative entries in h: a naive (h - ...) * 0 would leave -0.0 behind.
        extra = {"mask": ~padded, "grad_scores_sum": -torch.rand(2, num_experts, generator=g) - 0.5}
    grad = moe_topk_gate_backward(scores, topk_idx, weights, grad_w, 1.5, **extra)
    assert_bitwise_equal(grad[padded], torch.zeros(3, num_experts))
    assert bool((grad[~padded] != 0).any())


def softplus_sqrt(x: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(torch.relu(x) + torch.log1p(torch.exp(-x.abs())))


def autograd_case(logits: torch.Tensor, topk_idx: torch.Tensor, grad_w: torch.Tensor, scale: float,
                  mask: torch.Tensor | None, grad_scores_sum: torch.Tensor | None):
    """(u, w, dL/dlogits) in float64 for ``L = <g, w> + <h, P>`` with the selection held fixed."""
    x = logits.clone().requires_grad_(True)
    y = softplus_sqrt(x)
    valid = topk_idx >= 0
    y_sel = torch.where(valid, torch.gather(y, 1, topk_idx.clamp(min=0)), 0.0)
    w = scale * y_sel / (y_sel.sum(dim=1, keepdim=True) + 1e-20)
    loss = (torch.where(valid, grad_w, 0.0) * w).sum()
    if grad_scores_sum is not None:
        num_seq, num_experts = grad_scores_sum.shape
        share = torch.where(mask[:, None], y / y.sum(dim=1, keepdim=True), 0.0)
        per_seq = share.reshape(num_seq, -1, num_experts).sum(dim=1)
        loss = loss + (grad_scores_sum * per_seq).sum()
    (grad,) = torch.autograd.grad(loss, x)
    return y.detach(), w.detach(), grad


@pytest.mark.parametrize(("num_seq", "aux"), [(1, False), (1, True), (2, True), (3, True)])
def test_matches_autograd_in_float64(num_seq: int, aux: bool) -> None:
    g = torch.Generator().manual_seed(10 + num_seq)
    num_tokens, num_experts = 6, 8
    logits = torch.randn(num_tokens, num_experts, generator=g, dtype=torch.float64) * 3
    # Distinct top-3, a duplicated fixed pick, invalid slots, and a token with no expert at all.
    topk_idx = i64([[0, 5, 2], [7, 7, 1], [3, -1, 6], [-1, -1, -1], [4, 0, 3], [2, 2, 2]])
    grad_w = torch.randn(num_tokens, 3, generator=g, dtype=torch.float64)
    mask = torch.tensor([True, False, True, True, False, True]) if aux else None
    h = torch.randn(num_seq, num_experts, generator=g, dtype=torch.float64) if aux else None
    u, w, expected = autograd_case(logits, topk_idx, grad_w, 1.5, mask, h)
    actual = _backward_f64(u, topk_idx, w, grad_w, 1.5, mask, h)
    assert actual.dtype == torch.float64
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12 * expected.abs().max().item())
    if not aux:
        assert_bitwise_equal(actual[3], torch.zeros(num_experts, dtype=torch.float64))


def test_float32_result_is_the_rounded_float64_one() -> None:
    g = torch.Generator().manual_seed(8)
    scores = torch.rand(4, 16, generator=g) * 3
    topk_idx = torch.stack([torch.randperm(16, generator=g)[:6] for _ in range(4)])
    weights, grad_w = torch.rand(4, 6, generator=g), torch.randn(4, 6, generator=g)
    mask, h = torch.tensor([True, True, False, True]), torch.randn(2, 16, generator=g)
    grad = moe_topk_gate_backward(scores, topk_idx, weights, grad_w, 1.5, mask=mask, grad_scores_sum=h)
    assert_bitwise_equal(grad, _backward_f64(scores, topk_idx, weights, grad_w, 1.5, mask, h).float())


@pytest.mark.parametrize("num_seq", [2, 3])
def test_each_token_reads_the_row_of_its_sequence(num_seq: int) -> None:
    num_tokens, num_experts = 6, 4
    scores = torch.rand(num_tokens, num_experts, generator=torch.Generator().manual_seed(num_seq)) + 0.5
    no_route = (torch.full((num_tokens, 1), -1), torch.zeros(num_tokens, 1), torch.zeros(num_tokens, 1), 1.5)
    mask = torch.ones(num_tokens, dtype=torch.bool)
    for seq in range(num_seq):
        h = torch.zeros(num_seq, num_experts)
        h[seq, 0] = 1.0
        grad = moe_topk_gate_backward(scores, *no_route, mask=mask, grad_scores_sum=h)
        touched = (grad != 0).any(dim=1)
        tokens_per_seq = num_tokens // num_seq
        assert touched.tolist() == [t // tokens_per_seq == seq for t in range(num_tokens)]


def test_bad_arguments() -> None:
    scores, idx, w = torch.rand(6, 4), torch.zeros(6, 2, dtype=torch.int64), torch.rand(6, 2)
    mask = torch.ones(6, dtype=torch.bool)
    with pytest.raises(ValueError, match="multiple"):
        moe_topk_gate_backward(scores, idx, w, w, 1.5, mask=mask, grad_scores_sum=torch.zeros(4, 4))
    with pytest.raises(ValueError, match="together"):
        moe_topk_gate_backward(scores, idx, w, w, 1.5, mask=mask)
    with pytest.raises(ValueError, match="scoring_func"):
        moe_topk_gate_backward(scores, idx, w, w, 1.5, scoring_func="softmax")
    with pytest.raises(ValueError, match="logical routed ids"):
        moe_topk_gate_backward(scores, idx + 4, w, w, 1.5)
    with pytest.raises(ValueError, match="topk_weights"):
        moe_topk_gate_backward(scores, idx, w[:, :1], w, 1.5)


def test_no_tokens() -> None:
    grad = moe_topk_gate_backward(torch.zeros(0, 8), torch.zeros(0, 2, dtype=torch.int64), torch.zeros(0, 2),
                                  torch.zeros(0, 2), 1.5, mask=torch.zeros(0, dtype=torch.bool),
                                  grad_scores_sum=torch.zeros(2, 8))
    assert tuple(grad.shape) == (0, 8) and grad.dtype == torch.float32
