"""The sqrt-softplus gate as an autograd function: ``loss.backward()`` runs the backward kernel.

``moe_topk_gate_autograd`` routes like ``moe_topk_gate_forward`` and returns weights
that carry a gradient to ``logits``. With ``num_sequences`` it also returns the
auxiliary-loss statistic ``scores_sum [Nseq, E]``: per sequence (``T / Nseq``
consecutive tokens) the sum over routed tokens (``mask`` True, ``force_random``
False) of ``u / sum(u)``, ``u = sqrt(softplus(logits))``. A load-balancing loss built
from it sends its gradient through the same backward kernel (the auxiliary term).

The forward saves the scores, the logical routed experts (-1 for masked and
force-random tokens, so those get no gradient), the routed weights and the mask.
Shared-expert slots have the constant weight 1 and no gradient.
"""

from __future__ import annotations

import torch

from .moe_topk_gate import moe_topk_gate_forward
from .moe_topk_gate_backward import moe_topk_gate_backward


def sequence_score_sums(scores: torch.Tensor, mask: torch.Tensor | None, num_sequences: int) -> torch.Tensor:
    """``sum over tokens t of sequence s with mask[t] of scores[t] / sum(scores[t])`` (fp32 ``[Nseq, E]``)."""
    num_tokens, num_experts = scores.shape
    totals = scores.sum(dim=1, keepdim=True)
    share = torch.where(totals > 0, scores / totals.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    if mask is not None:
        share = share * mask.reshape(-1, 1)
    return share.reshape(num_sequences, num_tokens // num_sequences, num_experts).sum(dim=1)


class MoETopkGate(torch.autograd.Function):
    """Forward: ``moe_topk_gate_forward``; backward: ``moe_topk_gate_backward``."""

    @staticmethod
    def forward(ctx, logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank,
                mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
                unmapped_topk_idx, force_random, num_sequences, target, flavor):
        num_tokens, num_experts = logits.shape
        scores = torch.empty_like(logits)
        if unmapped_topk_idx is None:
            unmapped_topk_idx = torch.empty(num_tokens, num_topk, dtype=torch.int64, device=logits.device)
        topk_idx, topk_weights = moe_topk_gate_forward(
            logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank,
            mask=mask, bias=bias, image_bias=image_bias, image_token_mask=image_token_mask,
            fix_routing_mask=fix_routing_mask, to_physical_map=to_physical_map, logical_count=logical_count,
            unmapped_topk_idx=unmapped_topk_idx, force_random=force_random, scores=scores, target=target,
            flavor=flavor)
        aux_mask = None
        if num_sequences is None:
            scores_sum = logits.new_empty(0, num_experts)
        else:
            # Force-random tokens have no scores (all 0): they stay out of the statistic.
            aux_mask = torch.ones(num_tokens, dtype=torch.bool, device=logits.device)
            if mask is not None:
                aux_mask &= mask.reshape(-1)
            if force_random is not None:
                aux_mask &= ~force_random.reshape(-1)
            scores_sum = sequence_score_sums(scores, aux_mask, num_sequences)
        ctx.save_for_backward(scores, unmapped_topk_idx, topk_weights[:, :num_topk].contiguous(), aux_mask)
        ctx.routed_scaling_factor = routed_scaling_factor
        ctx.num_sequences = num_sequences
        ctx.target, ctx.flavor = target, flavor
        ctx.mark_non_differentiable(topk_idx)
        return topk_idx, topk_weights, scores_sum

    @staticmethod
    def backward(ctx, grad_topk_idx, grad_topk_weights, grad_scores_sum):
        scores, unmapped, routed_weights, aux_mask = ctx.saved_tensors
        num_topk = unmapped.shape[1]
        if grad_topk_weights is None:
            grad_routed = torch.zeros_like(routed_weights)
        else:
            grad_routed = grad_topk_weights[:, :num_topk].float().contiguous()
        aux = {}
        if ctx.num_sequences is not None:
            if grad_scores_sum is None:
                grad_scores_sum = torch.zeros(ctx.num_sequences, scores.shape[1], device=scores.device)
            aux = {"mask": aux_mask, "grad_scores_sum": grad_scores_sum.float().contiguous()}
        grad_logits = moe_topk_gate_backward(scores, unmapped, routed_weights, grad_routed,
                                             ctx.routed_scaling_factor, target=ctx.target, flavor=ctx.flavor,
                                             **aux)
        return (grad_logits,) + (None,) * 17


def moe_topk_gate_autograd(logits: torch.Tensor, num_topk: int, use_shared_as_routed: bool, num_shared_experts: int,
                           routed_scaling_factor: float, ep_rank: int, scoring_func: str = "sqrtsoftplus",
                           mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                           image_bias: torch.Tensor | None = None, image_token_mask: torch.Tensor | None = None,
                           fix_routing_mask: torch.Tensor | None = None,
                           to_physical_map: torch.Tensor | None = None, logical_count: torch.Tensor | None = None,
                           unmapped_topk_idx: torch.Tensor | None = None, force_random: torch.Tensor | None = None,
                           *, num_sequences: int | None = None, target: str | None = None,
                           flavor: str | None = None):
    """The gate with autograd: ``(topk_idx, topk_weights)``, plus ``scores_sum`` with ``num_sequences``.

    Arguments as ``moe_topk_gate_forward`` (``scoring_func`` must be ``"sqrtsoftplus"``);
    ``num_sequences`` must divide the token count. ``topk_weights`` (and ``scores_sum``)
    are differentiable with respect to ``logits``.
    """
    if scoring_func != "sqrtsoftplus":
        raise ValueError(f"moe_topk_gate_autograd: scoring_func must be 'sqrtsoftplus', got {scoring_func!r}")
    if num_sequences is not None:
        if isinstance(num_sequences, bool) or not isinstance(num_sequences, int):
            raise TypeError(f"num_sequences must be an int, got {type(num_sequences).__name__}")
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
            raise ValueError("logits must be a 2-D tensor")
        if num_sequences < 1 or logits.shape[0] % num_sequences:
            raise ValueError(f"num_sequences must be >= 1 and divide the number of tokens ({logits.shape[0]}), "
                             f"got {num_sequences}")
    topk_idx, topk_weights, scores_sum = MoETopkGate.apply(
        logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, mask, bias,
        image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
        force_random, num_sequences, target, flavor)
    if num_sequences is None:
        return topk_idx, topk_weights
    return topk_idx, topk_weights, scores_sum
