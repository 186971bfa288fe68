"""PyTorch reference of ``top2_sum_gate``, TileKernels v1's group-limited gate (MoE spec §7.1, §2.2,
``docs/moe/top2_sum_gate.md``).

Written from the page, on whole tensors, not from the kernel. Every fp32 operation is rounded once, in
the page's order: fp32 values are held in float64 where a step needs a correctly rounded quotient
(float64 carries more than twice fp32's precision, so rounding its quotient to fp32 is the correctly
rounded fp32 quotient), and ``exp`` is ``vmi_core.fp32.exp``, the correctly rounded twin of the
kernels' ``exp``. Sums whose order the page fixes are written as loops over their terms.
"""

from __future__ import annotations

import torch

from vmi_core import fp32
from vmi_core.targets import Flavor, get_flavor
from vmi_moe.reference.indices import mask_indices_by_tp
from vmi_moe.reference.topk import stable_topk
from vmi_moe.softplus import sqrt_softplus

SCORING_FUNCS = ("sigmoid", "sqrtsoftplus", "softmax")
# Consecutive tokens step through the replicas of an expert by this prime.
REPLICA_STRIDE = 23333
DENOM_EPS = 1e-20
# The errors (the dispatch raises the same after the kernel).
NONFINITE_MESSAGE = ("logits of routed tokens must be finite (no NaN or inf), and so must the ranking keys of "
                     "normally routed ones (a non-finite bias, or a softmax logit + bias past the fp32 range)")
FIXED_MESSAGE = "unmapped_topk_idx holds fixed-routing experts outside [0, num_experts)"
MAP_MESSAGE = ("logical_count holds replica counts outside [1, to_physical_map.size(1)], or to_physical_map "
               "holds a negative physical id at a chosen replica")


def _quotient(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a / b`` of fp32 tensors, correctly rounded to fp32."""
    return (a.double() / b.double()).to(torch.float32)


def scores(logits: torch.Tensor, scoring_func: str, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """The unbiased fp32 scores ``u`` of finite fp32 logits ``[T, E]``.

    * ``sigmoid``: ``fl(1 / fl(1 + exp(-x)))``;
    * ``sqrtsoftplus``: ``vmi_moe.softplus.sqrt_softplus`` in the flavor's order;
    * ``softmax``: ``m`` = the row maximum, ``e = exp(fl(x - m))``, ``s`` = the sum of the row's
      ``e`` from expert 0 up, one rounding per addition, then ``fl(e / s)``.
    """
    if scoring_func == "sigmoid":
        one = torch.ones((), dtype=torch.float32)
        return _quotient(one.expand_as(logits), one + fp32.exp(-logits))
    if scoring_func == "sqrtsoftplus":
        return sqrt_softplus(logits, get_flavor(flavor))
    if scoring_func == "softmax":
        e = fp32.exp(logits - logits.max(dim=1, keepdim=True).values)
        s = torch.zeros(logits.shape[0], dtype=torch.float32)
        for col in range(logits.shape[1]):
            s = s + e[:, col]
        return _quotient(e, s[:, None].expand_as(e))
    raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")


def select_experts(keys: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int) -> torch.Tensor:
    """int64 ``[T, K]``: the ``K`` experts of largest key in rank order (descending, equal keys by
    ascending expert), among the experts of the ``num_topk_groups`` best groups when ``num_groups !=
    num_topk_groups`` (a group's score: the sum of its two largest keys; groups ranked by descending
    score, equal scores by ascending group)."""
    num_tokens, num_experts = keys.shape
    if num_groups != num_topk_groups:
        per_group = num_experts // num_groups
        top2 = keys.view(num_tokens, num_groups, per_group).topk(2, dim=-1).values
        group_scores = top2[..., 0] + top2[..., 1]
        kept_groups = stable_topk(group_scores, num_topk_groups)
        dropped = torch.ones(num_tokens, num_groups, dtype=torch.bool)
        dropped.scatter_(1, kept_groups, False)
        keys = keys.masked_fill(dropped.repeat_interleave(per_group, dim=1), float("-inf"))
    return stable_topk(keys, num_topk)


def top2_sum_gate(
    logits: torch.Tensor,
    bias: torch.Tensor,
    num_topk: int,
    num_topk_groups: int,
    num_groups: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    num_ep_ranks: int,
    tp_rank: int,
    num_tp_ranks: int,
    scoring_func: str,
    mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
    *,
    flavor: str | Flavor = "ascend",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(topk_idx int64 [T, P], topk_weights fp32 [T, P], unmapped int64 [T, K])`` on the CPU, for
    arguments the dispatch accepted (``P = K + S``). Inputs are never modified.

    Raises:
        ValueError: A non-finite logit of a routed token, a non-finite ranking key of a normally
            routed one; a fixed expert outside ``[0, E)``; a replica count outside ``[1, Dup]`` or a
            negative physical id at a chosen replica.
    """
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    logits = logits.detach().cpu()
    bias = bias.detach().cpu()
    num_tokens, num_experts = logits.shape
    num_shared = num_shared_experts if use_shared_as_routed else 0
    num_physical_topk = num_topk + num_shared

    active = torch.ones(num_tokens, dtype=torch.bool) if mask is None else mask.cpu().reshape(num_tokens)
    fixed = torch.zeros(num_tokens, dtype=torch.bool)
    if fix_routing_mask is not None:
        fixed = fix_routing_mask.cpu().reshape(num_tokens) & active
    normal = active & ~fixed

    topk_idx = torch.full((num_tokens, num_physical_topk), -1, dtype=torch.int64)
    topk_weights = torch.zeros((num_tokens, num_physical_topk), dtype=torch.float32)
    unmapped = torch.full((num_tokens, num_topk), -1, dtype=torch.int64)

    x = logits[active]
    if not bool(torch.isfinite(x).all()):
        raise ValueError(NONFINITE_MESSAGE)
    u = scores(x, scoring_func, flavor)
    keys = (x if scoring_func == "softmax" else u) + bias
    routed_normal = normal[active]
    if not bool(torch.isfinite(keys[routed_normal]).all()):
        raise ValueError(NONFINITE_MESSAGE)

    selected = torch.zeros((x.shape[0], num_topk), dtype=torch.int64)
    selected[routed_normal] = select_experts(keys[routed_normal], num_topk, num_topk_groups, num_groups)
    if fix_routing_mask is not None:
        given = unmapped_topk_idx.detach().cpu().to(torch.int64)[active]
        routed_fixed = fixed[active]
        if bool(((given[routed_fixed] < 0) | (given[routed_fixed] >= num_experts)).any()):
            raise ValueError(FIXED_MESSAGE)
        selected[routed_fixed] = given[routed_fixed]

    # 1e-20 first, then the selected scores in slot order; one division each, then the factor.
    values = torch.gather(u, 1, selected)
    d = torch.full((x.shape[0],), DENOM_EPS, dtype=torch.float32)
    for slot in range(num_topk):
        d = d + values[:, slot]
    scale = torch.tensor(routed_scaling_factor, dtype=torch.float32)
    routed_weights = _quotient(values, d[:, None].expand_as(values)) * scale
    shared_ids = (num_experts + torch.arange(num_shared, dtype=torch.int64)).expand(x.shape[0], num_shared)
    logical = torch.cat([selected, shared_ids], dim=1)
    weights = torch.cat([routed_weights, torch.ones((x.shape[0], num_shared), dtype=torch.float32)], dim=1)

    physical = logical
    num_replicas = 1
    if to_physical_map is not None:
        to_physical_map = to_physical_map.cpu().to(torch.int64)
        num_replicas = to_physical_map.shape[1]
        counts = logical_count.cpu().to(torch.int64)[logical]
        if bool(((counts < 1) | (counts > num_replicas)).any()):
            raise ValueError(MAP_MESSAGE)
        tokens = torch.arange(num_tokens, dtype=torch.int64)[active]
        # int64 and a non-negative modulo: TileKernels' int32 formula wraps from t = 92037 on (spec §11.2).
        replica = torch.remainder(ep_rank + tokens[:, None] * REPLICA_STRIDE, counts)
        physical = to_physical_map[logical, replica]
        if bool((physical < 0).any()):
            raise ValueError(MAP_MESSAGE)
    # EP/TP masking: per_rank = (E + Dup - 1) // num_ep_ranks experts per EP rank.
    physical = mask_indices_by_tp(physical, num_experts + num_replicas - 1, num_ep_ranks, tp_rank, num_tp_ranks)

    topk_idx[active] = physical
    topk_weights[active] = weights
    unmapped[active] = selected
    device = logits.device
    return topk_idx.to(device), topk_weights.to(device), unmapped.to(device)
