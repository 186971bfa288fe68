"""PyTorch reference of the top-k selection (MoE spec §3.2, §3.3, §8).

Rank order: value descending, equal values by ascending index.
"""

import torch


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64 ``[T, k]``, strides ``(k, 1)``) of the ``k`` largest scores of each row, in rank order."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    # A fresh tensor has strides (k, 1) even for T == 0 or k == 1, which .contiguous() does not promise.
    return torch.empty((scores.shape[0], k), dtype=torch.int64, device=scores.device).copy_(order)


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """``stable_topk`` of a 2-D score matrix whose values must all be finite (-inf included)."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be 2-D, got shape {tuple(scores.shape)}")
    num_experts = scores.shape[1]
    if not 1 <= num_topk <= num_experts:
        raise ValueError(f"num_topk must be in [1, {num_experts}] (the number of experts), got {num_topk}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores must be finite (no NaN, +inf or -inf)")
    return stable_topk(scores, num_topk)


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """Per token, the ``num_topk_groups`` groups of ``scores [T, G, P]`` with the largest group scores, in
    rank order (``stable_topk`` of the group scores): a group's score is its largest score
    (``num_topk_sum = 1``) or the fp32 sum of its two largest (``2``; equal maxima both count)."""
    if scores.dim() != 3:
        raise ValueError(f"scores must be 3-D [tokens, groups, experts per group], got shape {tuple(scores.shape)}")
    largest = torch.topk(scores, num_topk_sum, dim=-1).values
    group_scores = largest[..., 0] if num_topk_sum == 1 else largest[..., 0] + largest[..., 1]
    if bool(scores.isnan().any()) or bool(group_scores.isnan().any()):
        raise ValueError("scores must hold no NaN, and no group's two largest scores may be +inf and -inf")
    return stable_topk(group_scores, num_topk_groups)
