"""PyTorch reference of the MoE top-k gate backward (MoE spec §6.2, §6.3).

Computed in float64 and rounded once to fp32. With ``u`` the forward scores,
``w`` the routed weights and ``g`` their upstream gradient, per token:

* route term: ``r_e = sum over valid slots j with idx_j = e of (s*g_j - <g, w>) / D``,
  ``D = sum of the selected u + 1e-20`` (slots with idx -1 are excluded everywhere,
  duplicated ids accumulate);
* aux term (with ``grad_scores_sum`` h, one row per sequence of ``T / Nseq``
  consecutive tokens): ``a_e = (h_e - <h, u> / U) / U``, ``U = sum_e u_e``, and 0
  for tokens whose ``mask`` is False;
* ``grad_logits = y'(u) * (r + a)`` with ``y'(u) = -expm1(-u^2) / (2u)`` for
  ``u > 0``, else 0.
"""

import torch

from vmi_moe.reference.gate import check_scoring_func

EPSILON = 1e-20


def _dscore_dlogit(u: torch.Tensor) -> torch.Tensor:
    """``d sqrt(softplus(x)) / dx`` from ``u = sqrt(softplus(x))``, float64; +0.0 where ``u <= 0``."""
    positive = u > 0
    safe = torch.where(positive, u, 1.0)
    return torch.where(positive, -torch.expm1(-safe * safe) / (2.0 * safe), 0.0)


def _backward_f64(scores: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                  grad_topk_weights: torch.Tensor, routed_scaling_factor: float,
                  mask: torch.Tensor | None = None, grad_scores_sum: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient w.r.t. the logits in float64 ``[T, E]``; inputs of any float dtype are widened exactly."""
    u = scores.to(torch.float64)
    valid = topk_idx >= 0
    slots = topk_idx.clamp(min=0)
    grad_w = torch.where(valid, grad_topk_weights.to(torch.float64), 0.0)
    denom = torch.where(valid, torch.gather(u, 1, slots), 0.0).sum(dim=1, keepdim=True) + EPSILON
    inner = (grad_w * topk_weights.to(torch.float64)).sum(dim=1, keepdim=True)
    delta = torch.where(valid, (routed_scaling_factor * grad_w - inner) / denom, 0.0)
    grad = torch.zeros_like(u).scatter_add_(1, slots, delta)
    if grad_scores_sum is not None:
        tokens_per_seq = u.shape[0] // grad_scores_sum.shape[0]
        h = grad_scores_sum.to(torch.float64).repeat_interleave(tokens_per_seq, dim=0)
        mask = mask.reshape(-1, 1)
        inv = torch.where(mask, 1.0 / torch.where(mask, u.sum(dim=1, keepdim=True), 1.0), 0.0)
        grad = grad + (h - (h * u).sum(dim=1, keepdim=True) * inv) * inv
    return _dscore_dlogit(u) * grad


def moe_topk_gate_backward(scores: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                           grad_topk_weights: torch.Tensor, routed_scaling_factor: float,
                           scoring_func: str = "sqrtsoftplus", mask: torch.Tensor | None = None,
                           grad_scores_sum: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 ``[T, E]`` gradient of the loss w.r.t. the gate logits.

    ``topk_idx`` holds the logical routed ids ``[T, K]`` (-1 = no expert); ``mask``
    (bool ``[T]``) and ``grad_scores_sum`` (fp32 ``[Nseq, E]``, ``T % Nseq == 0``)
    enable the auxiliary term and come together. The same for every flavor.
    """
    check_scoring_func(scoring_func)
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be a 2-D float32 tensor, got {scores.dtype} of shape {tuple(scores.shape)}")
    num_tokens, num_experts = scores.shape
    if topk_idx.dim() != 2 or topk_idx.dtype != torch.int64 or topk_idx.shape[0] != num_tokens:
        raise ValueError(f"topk_idx must be int64 of shape ({num_tokens}, K), "
                         f"got {topk_idx.dtype} of shape {tuple(topk_idx.shape)}")
    num_topk = topk_idx.shape[1]
    if not 1 <= num_topk <= num_experts:
        raise ValueError(f"topk_idx must have 1 to {num_experts} columns (the number of experts), got {num_topk}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("scores must be finite (no NaN or inf)")
    if bool((topk_idx >= num_experts).any()):
        raise ValueError(f"topk_idx must hold logical routed ids below {num_experts} or -1")
    for name, tensor in (("topk_weights", topk_weights), ("grad_topk_weights", grad_topk_weights)):
        if tensor.dtype != torch.float32 or tensor.shape != topk_idx.shape:
            raise ValueError(f"{name} must be float32 of shape {tuple(topk_idx.shape)}, "
                             f"got {tensor.dtype} of shape {tuple(tensor.shape)}")
    if (mask is None) != (grad_scores_sum is None):
        raise ValueError("mask and grad_scores_sum must be given together")
    if mask is not None:
        if mask.dtype != torch.bool or mask.numel() != num_tokens:
            raise ValueError(f"mask must be a bool tensor of {num_tokens} elements, "
                             f"got {mask.dtype} of shape {tuple(mask.shape)}")
        if grad_scores_sum.dim() != 2 or grad_scores_sum.dtype != torch.float32 \
                or grad_scores_sum.shape[1] != num_experts or grad_scores_sum.shape[0] < 1:
            raise ValueError(f"grad_scores_sum must be float32 of shape (Nseq, {num_experts}) with Nseq >= 1, "
                             f"got {grad_scores_sum.dtype} of shape {tuple(grad_scores_sum.shape)}")
        if num_tokens % grad_scores_sum.shape[0]:
            raise ValueError(f"the number of tokens ({num_tokens}) must be a multiple of the number of "
                             f"sequences ({grad_scores_sum.shape[0]})")
    scale = float(torch.tensor(routed_scaling_factor, dtype=torch.float32))
    return _backward_f64(scores, topk_idx, topk_weights, grad_topk_weights, scale, mask,
                         grad_scores_sum).to(torch.float32)
