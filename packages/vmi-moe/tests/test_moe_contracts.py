"""Contracts the MoE ops document, under input that breaks them.

- A data error the kernel finds (non-finite logits or scores, expert ids out of range)
  raises ``ValueError`` and leaves every tensor the caller passed in to be written
  (``out``, ``scores``, ``unmapped_topk_idx``) as it was.
- A row-strided ``unmapped_topk_idx`` that the forward writes is accepted by the backward,
  also through autograd, with the same bits as a packed one.
"""

import pytest
import torch

from vmi_core.tools.testing import assert_bitwise_equal, generator
from vmi_moe import moe_topk_gate_autograd, moe_topk_gate_backward, moe_topk_gate_forward

E, K, T = 72, 6, 70
TARGETS = ["cpu", "ascend-sim"]
# The in-kernel errors on ascend-sim (each builds its own simulator) run in the slow run.
SIM_SLOW_TARGETS = ["cpu", pytest.param("ascend-sim", marks=pytest.mark.slow)]


def _logits(seed: int) -> torch.Tensor:
    return torch.randn(T, E, generator=generator(seed))


def _sentinels():
    return (torch.full((T, K), -7, dtype=torch.int64), torch.full((T, K), 3.5),
            torch.full((T, E), -2.5), torch.full((T, K), 11, dtype=torch.int64))


@pytest.mark.parametrize("target", SIM_SLOW_TARGETS)
def test_forward_data_error_leaves_the_callers_tensors_alone(target):
    logits = _logits(1)
    logits[33, 5] = float("nan")
    idx, weights, scores, unmapped = _sentinels()
    before = [t.clone() for t in (idx, weights, scores, unmapped)]
    with pytest.raises(ValueError, match="logits contains non-finite values"):
        moe_topk_gate_forward(logits, K, False, 0, 1.0, 0, out=(idx, weights), scores=scores,
                              unmapped_topk_idx=unmapped, target=target)
    for name, t, was in zip(("out[0]", "out[1]", "scores", "unmapped_topk_idx"), (idx, weights, scores, unmapped),
                            before, strict=True):
        assert_bitwise_equal(t, was, f"{name} was written although the call failed")


@pytest.mark.parametrize("target", SIM_SLOW_TARGETS)
def test_fixed_routing_error_leaves_the_callers_tensors_alone(target):
    fixed = torch.zeros(T, dtype=torch.bool)
    fixed[10] = True
    idx, weights, scores, unmapped = _sentinels()
    unmapped[10, 2] = E  # out of range
    before = [t.clone() for t in (idx, weights, scores, unmapped)]
    with pytest.raises(ValueError, match="fixed-routing experts outside"):
        moe_topk_gate_forward(_logits(2), K, False, 0, 1.0, 0, fix_routing_mask=fixed, out=(idx, weights),
                              scores=scores, unmapped_topk_idx=unmapped, target=target)
    for t, was in zip((idx, weights, scores, unmapped), before, strict=True):
        assert_bitwise_equal(t, was)


@pytest.mark.parametrize("target", SIM_SLOW_TARGETS)
def test_backward_data_error_leaves_out_alone(target):
    logits = _logits(3)
    scores = torch.empty_like(logits)
    unmapped = torch.empty(T, K, dtype=torch.int64)
    _, weights = moe_topk_gate_forward(logits, K, False, 0, 1.0, 0, scores=scores, unmapped_topk_idx=unmapped,
                                       target=target)
    bad = unmapped.clone()
    bad[5, 0] = E + 3
    out = torch.full_like(logits, 9.0)
    with pytest.raises(ValueError, match="topk_idx holds ids outside"):
        moe_topk_gate_backward(scores, bad, weights, torch.ones_like(weights), 1.0, out=out, target=target)
    assert_bitwise_equal(out, torch.full_like(logits, 9.0), "out was written although the call failed")
    # The same call with good ids fills out.
    moe_topk_gate_backward(scores, unmapped, weights, torch.ones_like(weights), 1.0, out=out, target=target)
    assert_bitwise_equal(out, moe_topk_gate_backward(scores, unmapped, weights, torch.ones_like(weights), 1.0,
                                                     target=target))


@pytest.mark.parametrize("target", SIM_SLOW_TARGETS)
def test_row_strided_unmapped_topk_idx_through_autograd(target):
    logits = _logits(4).requires_grad_()
    padded = torch.full((T, K + 3), -5, dtype=torch.int64)
    strided = padded[:, :K]
    assert not strided.is_contiguous()
    _, weights = moe_topk_gate_autograd(logits, K, False, 0, 1.0, 0, unmapped_topk_idx=strided, target=target)
    grad_out = torch.randn(weights.shape, generator=generator(5))
    (weights * grad_out).sum().backward()
    strided_grad = logits.grad.clone()

    logits.grad = None
    packed = torch.empty(T, K, dtype=torch.int64)
    _, weights = moe_topk_gate_autograd(logits, K, False, 0, 1.0, 0, unmapped_topk_idx=packed, target=target)
    (weights * grad_out).sum().backward()
    assert_bitwise_equal(strided, packed, "unmapped ids", check_stride=False)
    assert_bitwise_equal(strided_grad, logits.grad, "logits.grad")
    assert torch.all(padded[:, K:] == -5), "the padding columns were written"


def test_backward_rejects_a_column_strided_topk_idx():
    scores = torch.rand(T, E)
    idx = torch.zeros(T, 2 * K, dtype=torch.int64)[:, ::2]
    weights = torch.rand(T, K)
    with pytest.raises(ValueError, match="topk_idx must have unit column stride"):
        moe_topk_gate_backward(scores, idx, weights, weights, 1.0)


def test_outputs_that_share_memory_with_inputs_or_each_other_are_rejected():
    logits = _logits(6)
    flat = torch.empty(T * E)
    with pytest.raises(ValueError, match=r"scores shares memory with logits"):
        moe_topk_gate_forward(logits, K, False, 0, 1.0, 0, scores=logits)
    with pytest.raises(ValueError, match=r"out\[1\] \(topk_weights\) shares memory with scores"):
        moe_topk_gate_forward(logits, K, False, 0, 1.0, 0, scores=flat.view(T, E),
                              out=(torch.empty(T, K, dtype=torch.int64), flat[: T * K].view(T, K)))
    with pytest.raises(ValueError, match=r"unmapped_topk_idx shares memory with logits"):
        moe_topk_gate_forward(logits, K, False, 0, 1.0, 0, unmapped_topk_idx=logits.view(torch.int64)[:, :K])
    with pytest.raises(ValueError, match=r"out\[0\] \(topk_idx\) must be contiguous"):
        moe_topk_gate_forward(logits, K, False, 0, 1.0, 0,
                              out=(torch.zeros(1, K, dtype=torch.int64).expand(T, K), torch.empty(T, K)))


def test_backward_out_sharing_memory_with_an_input_is_rejected():
    scores = torch.rand(T, E)
    idx = torch.zeros(T, K, dtype=torch.int64)
    weights = torch.rand(T, K)
    with pytest.raises(ValueError, match="out shares memory with scores"):
        moe_topk_gate_backward(scores, idx, weights, weights, 1.0, out=scores)
