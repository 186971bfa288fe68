"""The sqrt-softplus gate with autograd: ``loss.backward()`` runs the backward kernel.

``moe_topk_gate_autograd`` routes like ``moe_topk_gate_forward`` and returns weights
that carry a gradient to ``logits``. With ``num_sequences`` it also returns the
auxiliary-loss statistic ``scores_sum [Nseq, E]``: per sequence (``T / Nseq``
consecutive tokens) the sum over routed tokens (``mask`` True, ``force_random``
False) of ``u / sum(u)``, ``u = sqrt(softplus(logits))``. A load-balancing loss built
from it sends its gradient through the same backward kernel (the auxiliary term).

It is the custom op ``torch.ops.vmi.moe_topk_gate_autograd`` with a registered backward
(``torch.library.register_autograd``), so ``torch.compile`` traces through it. Its forward
returns what the backward needs besides the results: the scores, the logical routed experts
(-1 for masked and force-random tokens, so those get no gradient) and the routed-token mask.
Shared-expert slots have the constant weight 1 and no gradient.
"""

from __future__ import annotations

import torch

from vmi_core.autograd import first_order
from vmi_core.checks import check_int, check_tensor
from vmi_core.library import KernelOp, Param

from .ops.moe_topk_gate import MOE_TOPK_GATE_FORWARD
from .ops.moe_topk_gate_backward import moe_topk_gate_backward


def sequence_score_sums(scores: torch.Tensor, mask: torch.Tensor | None, num_sequences: int) -> torch.Tensor:
    """``sum over tokens t of sequence s with mask[t] of scores[t] / sum(scores[t])`` (fp32 ``[Nseq, E]``)."""
    num_tokens, num_experts = scores.shape
    totals = scores.sum(dim=1, keepdim=True)
    share = torch.where(totals > 0, scores / totals.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    if mask is not None:
        share = share * mask.reshape(-1, 1)
    return share.reshape(num_sequences, num_tokens // num_sequences, num_experts).sum(dim=1)


def _run(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, mask, bias,
         image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, fixed_topk_idx, force_random,
         num_sequences, *, out, target, flavor, launch):
    """The forward with everything the backward needs as outputs (a custom op's autograd sees only
    its inputs and outputs): ``(topk_idx, topk_weights, scores_sum, scores, routed_topk_idx,
    routed_mask)``."""
    if num_sequences is not None:
        check_int(num_sequences, "num_sequences")
        if logits.dim() != 2:
            raise ValueError("logits must be a 2-D tensor")
        if num_sequences < 1 or logits.shape[0] % num_sequences:
            raise ValueError(f"num_sequences must be >= 1 and divide the number of tokens ({logits.shape[0]}), "
                             f"got {num_sequences}")
    check_tensor(logits, "logits", dtype=torch.float32, shape=(None, None))
    num_tokens, num_experts = logits.shape
    scores = torch.empty_like(logits)
    routed = (torch.empty(num_tokens, num_topk, dtype=torch.int64, device=logits.device) if fixed_topk_idx is None
              else fixed_topk_idx.clone())
    topk_idx, topk_weights = MOE_TOPK_GATE_FORWARD.run(
        logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, "sqrtsoftplus",
        mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, routed,
        force_random, scores, out=None, target=target, flavor=flavor, launch=launch)
    # Force-random tokens have no scores (all 0): they stay out of the statistic.
    routed_mask = torch.ones(num_tokens, dtype=torch.bool, device=logits.device)
    if mask is not None:
        routed_mask &= mask.reshape(-1)
    if force_random is not None:
        routed_mask &= ~force_random.reshape(-1)
    if num_sequences is None:
        scores_sum = logits.new_empty(0, num_experts)
    else:
        scores_sum = sequence_score_sums(scores, routed_mask, num_sequences)
    return topk_idx, topk_weights, scores_sum, scores, routed, routed_mask


def _setup_context(ctx, inputs, output, keyword_only_inputs):
    topk_idx, topk_weights, _, scores, routed, routed_mask = output
    ctx.save_for_backward(scores, routed, topk_weights, routed_mask)
    ctx.routed_scaling_factor, ctx.num_sequences = inputs[4], inputs[15]
    ctx.target, ctx.flavor = keyword_only_inputs.get("target"), keyword_only_inputs.get("flavor")
    ctx.mark_non_differentiable(topk_idx, scores, routed, routed_mask)


@first_order(name="moe_topk_gate_autograd")
def _backward(ctx, grad_topk_idx, grad_topk_weights, grad_scores_sum, grad_scores, grad_routed, grad_routed_mask):
    scores, routed, topk_weights, routed_mask = ctx.saved_tensors
    num_topk = routed.shape[1]
    routed_weights = topk_weights[:, :num_topk].contiguous()
    if grad_topk_weights is None:
        grad_routed_weights = torch.zeros_like(routed_weights)
    else:
        grad_routed_weights = grad_topk_weights[:, :num_topk].float().contiguous()
    aux = {}
    if ctx.num_sequences is not None:
        if grad_scores_sum is None:
            grad_scores_sum = torch.zeros(ctx.num_sequences, scores.shape[1], device=scores.device)
        aux = {"mask": routed_mask, "grad_scores_sum": grad_scores_sum.float().contiguous()}
    grad_logits = moe_topk_gate_backward(scores, routed, routed_weights, grad_routed_weights,
                                         ctx.routed_scaling_factor, target=ctx.target, flavor=ctx.flavor, **aux)
    return (grad_logits,) + (None,) * 15


def _optional(name: str) -> Param:
    return Param(name, "Tensor", None, optional=True)


MOE_TOPK_GATE_AUTOGRAD = KernelOp(
    "moe_topk_gate_autograd",
    (Param("logits", "Tensor"), Param("num_topk", "int"), Param("use_shared_as_routed", "bool"),
     Param("num_shared_experts", "int"), Param("routed_scaling_factor", "float"), Param("ep_rank", "int"),
     _optional("mask"), _optional("bias"), _optional("image_bias"), _optional("image_token_mask"),
     _optional("fix_routing_mask"), _optional("to_physical_map"), _optional("logical_count"),
     _optional("fixed_topk_idx"), _optional("force_random"), Param("num_sequences", "int", None, optional=True)),
    ("topk_idx", "topk_weights", "scores_sum", "scores", "routed_topk_idx", "routed_mask"), _run,
    autograd=(_backward, _setup_context))


def moe_topk_gate_autograd(logits: torch.Tensor, num_topk: int, use_shared_as_routed: bool, num_shared_experts: int,
                           routed_scaling_factor: float, ep_rank: int, scoring_func: str = "sqrtsoftplus",
                           mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                           image_bias: torch.Tensor | None = None, image_token_mask: torch.Tensor | None = None,
                           fix_routing_mask: torch.Tensor | None = None,
                           to_physical_map: torch.Tensor | None = None, logical_count: torch.Tensor | None = None,
                           unmapped_topk_idx: torch.Tensor | None = None, force_random: torch.Tensor | None = None,
                           *, num_sequences: int | None = None, target: str | None = None,
                           flavor: str | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gate with autograd: ``(topk_idx, topk_weights)``, plus ``scores_sum`` with ``num_sequences``.

    Routes like ``moe_topk_gate_forward``; ``topk_weights`` (and ``scores_sum``) are
    differentiable with respect to ``logits``, their backward being
    ``moe_topk_gate_backward``. Shared-expert slots have no gradient.

    Args:
        logits: As ``moe_topk_gate_forward``.
        num_topk: As ``moe_topk_gate_forward``.
        use_shared_as_routed: As ``moe_topk_gate_forward``.
        num_shared_experts: As ``moe_topk_gate_forward``.
        routed_scaling_factor: As ``moe_topk_gate_forward``.
        ep_rank: As ``moe_topk_gate_forward``.
        scoring_func: Must be ``"sqrtsoftplus"``.
        mask: As ``moe_topk_gate_forward``.
        bias: As ``moe_topk_gate_forward``.
        image_bias: As ``moe_topk_gate_forward``.
        image_token_mask: As ``moe_topk_gate_forward``.
        fix_routing_mask: As ``moe_topk_gate_forward``.
        to_physical_map: As ``moe_topk_gate_forward``.
        logical_count: As ``moe_topk_gate_forward``.
        unmapped_topk_idx: As ``moe_topk_gate_forward``: the fixed experts of
            ``fix_routing_mask`` tokens; receives the logical routed experts.
        force_random: As ``moe_topk_gate_forward``.
        num_sequences: Optional number of sequences ``Nseq >= 1`` dividing ``T`` (``T / Nseq``
            consecutive tokens each): also return ``scores_sum``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``logits``.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        ``(topk_idx, topk_weights)`` as ``moe_topk_gate_forward`` returns them (int64 and fp32
        ``[T, P]``), and with ``num_sequences`` also ``scores_sum``, fp32 ``[Nseq, E]``: per
        sequence, the sum over routed tokens (``mask`` True, ``force_random`` False) of
        ``u / sum(u)``.

    Raises:
        TypeError: ``num_sequences`` is neither an int nor None; otherwise as
            ``moe_topk_gate_forward``.
        ValueError: ``scoring_func`` is not ``"sqrtsoftplus"``; ``num_sequences`` is < 1 or
            does not divide ``T``; otherwise as ``moe_topk_gate_forward`` (the data errors
            after the kernel ran included).
    """
    if scoring_func != "sqrtsoftplus":
        raise ValueError(f"moe_topk_gate_autograd: scoring_func must be 'sqrtsoftplus', got {scoring_func!r}")
    topk_idx, topk_weights, scores_sum, _, routed, _ = MOE_TOPK_GATE_AUTOGRAD(
        logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, mask, bias,
        image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
        force_random, num_sequences, target=target, flavor=flavor)
    if unmapped_topk_idx is not None:
        # As moe_topk_gate_forward does: the caller's tensor receives the logical routed experts.
        unmapped_topk_idx.copy_(routed)
    if num_sequences is None:
        return topk_idx, topk_weights
    return topk_idx, topk_weights, scores_sum
