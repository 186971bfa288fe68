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
