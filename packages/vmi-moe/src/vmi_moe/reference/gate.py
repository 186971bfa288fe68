"""PyTorch reference of the MoE top-k gate forward (MoE spec §5.2, §5.4, §11.2).

Per token, in order of precedence: a masked token routes nowhere; a force-random
token gets distinct random physical experts with random weights; otherwise the
unbiased scores ``u = sqrt(softplus(logits))`` are ranked with a bias added
(fixed routing takes the experts from ``unmapped_topk_idx`` instead), the chosen
scores are normalised in the flavor's summation order and scaled, shared experts
are appended with weight 1 and logical ids are mapped to physical replicas.
"""

import torch

from vmi_core.stochastic import sr_hash
from vmi_core.targets import Flavor, get_flavor
from vmi_moe.reference.normalize import denominator
from vmi_moe.reference.topk import stable_topk
from vmi_moe.softplus import sqrt_softplus

SCORING_FUNC = "sqrtsoftplus"
# Consecutive tokens step through the replicas of an expert by this prime.
REPLICA_STRIDE = 23333
# The fourth hash word of force-random draws: non-zero, so token 0 / lane 0 / rank 0 is not the all-zero hash.
RANDOM_TAG = 0x9E3779B9
_U32 = 0xFFFFFFFF


def check_scoring_func(scoring_func: str) -> None:
    if scoring_func != SCORING_FUNC:
        raise ValueError(f"scoring_func must be {SCORING_FUNC!r}, got {scoring_func!r}")


def resolve_collisions(draws: torch.Tensor, num_physical_experts: int) -> torch.Tensor:
    """Distinct expert ids (int64 ``[T, P]``) from per-lane draws with ``0 <= draws[:, l] < N - l``.

    P rounds: the lowest unresolved lane holding the smallest draw ``m`` resolves to
    ``m``; every unresolved lane above it whose draw is ``>= m`` steps up by one.
    """
    if draws.dim() != 2:
        raise ValueError(f"draws must be 2-D, got shape {tuple(draws.shape)}")
    num_lanes = draws.shape[1]
    lanes = torch.arange(num_lanes, dtype=torch.int64, device=draws.device)
    pending = draws.to(torch.int64).clone()
    if bool(((pending < 0) | (pending >= num_physical_experts - lanes)).any()):
        raise ValueError(f"draws of lane l must lie in [0, {num_physical_experts} - l)")
    resolved = torch.zeros_like(pending, dtype=torch.bool)
    out = torch.empty_like(pending)
    for _ in range(num_lanes):
        # Every draw stays below N (lane l steps up at most l times), so N marks resolved lanes.
        candidates = torch.where(resolved, num_physical_experts, pending)
        smallest = candidates.min(dim=1, keepdim=True).values
        winner = torch.where(candidates == smallest, lanes, num_lanes).min(dim=1, keepdim=True).values
        out.scatter_(1, winner, smallest)
        resolved |= lanes == winner
        pending += (~resolved & (lanes > winner) & (pending >= smallest)).to(torch.int64)
    return out


def force_random_route(num_tokens: int, num_physical_topk: int, num_physical_experts: int,
                       ep_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random routing of every token: (distinct physical ids int64 ``[T, P]``, weights fp32 ``[T, P]`` in (0, 1]).

    Lane l of token t hashes ``(ep_rank, t, l, RANDOM_TAG)``: ``r0`` gives the weight
    ``((r0 >> 8) + 1) * 2**-24``, ``r1 mod (N - l)`` the draw for ``resolve_collisions``.
    """
    if num_physical_experts < num_physical_topk:
        raise ValueError(f"force-random routing needs at least {num_physical_topk} physical experts "
                         f"(num_physical_topk), got {num_physical_experts}")
    tokens = torch.arange(num_tokens, dtype=torch.int64)[:, None]
    lanes = torch.arange(num_physical_topk, dtype=torch.int64)[None, :]
    zero = torch.zeros((), dtype=torch.int64)
    r0, r1 = sr_hash(torch.tensor(ep_rank & _U32), tokens, lanes, torch.tensor(RANDOM_TAG), zero)
    weights = ((r0 >> 8) + 1).to(torch.float32) * 2.0 ** -24
    draws = r1 % (num_physical_experts - lanes)
    return resolve_collisions(draws, num_physical_experts), weights


def _row_flags(flags: torch.Tensor | None, num_tokens: int, name: str) -> torch.Tensor | None:
    if flags is None:
        return None
    if flags.dtype != torch.bool or flags.numel() != num_tokens:
        raise ValueError(f"{name} must be a bool tensor of {num_tokens} elements, "
                         f"got {flags.dtype} of shape {tuple(flags.shape)}")
    return flags.reshape(num_tokens)


def _check_expert_vector(vector: torch.Tensor | None, num_experts: int, name: str) -> None:
    if vector is not None and (vector.dtype != torch.float32 or tuple(vector.shape) != (num_experts,)):
        raise ValueError(f"{name} must be float32 of shape ({num_experts},), "
                         f"got {vector.dtype} of shape {tuple(vector.shape)}")


def moe_topk_gate_forward(
    logits: torch.Tensor,
    num_topk: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    scoring_func: str = SCORING_FUNC,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    image_bias: torch.Tensor | None = None,
    image_token_mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
    force_random: torch.Tensor | None = None,
    *,
    flavor: str | Flavor = "ascend",
    unbiased_scores: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(topk_idx int64 [T, P], topk_weights fp32 [T, P], unmapped int64 [T, K], scores fp32 [T, E])``.

    ``P = K + S`` with ``S = num_shared_experts`` if ``use_shared_as_routed`` else 0.
    ``unbiased_scores`` (fp32 ``[T, E]``) replaces ``sqrt_softplus(logits)`` for the
    routed tokens. Inputs are never modified.
    """
    check_scoring_func(scoring_func)
    flavor = get_flavor(flavor)
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be a 2-D float32 tensor, got {logits.dtype} of shape {tuple(logits.shape)}")
    num_tokens, num_experts = logits.shape
    device = logits.device
    if not 1 <= num_topk <= num_experts:
        raise ValueError(f"num_topk must be in [1, {num_experts}] (the number of experts), got {num_topk}")
    num_shared = num_shared_experts if use_shared_as_routed else 0
    if use_shared_as_routed and num_shared not in (1, 2):
        raise ValueError(f"num_shared_experts must be 1 or 2 with use_shared_as_routed, got {num_shared_experts}")
    num_physical_topk = num_topk + num_shared
    num_logical = num_experts + num_shared

    _check_expert_vector(bias, num_experts, "bias")
    _check_expert_vector(image_bias, num_experts, "image_bias")
    if (image_bias is None) != (image_token_mask is None):
        raise ValueError("image_bias and image_token_mask must be given together")
    image_token_mask = _row_flags(image_token_mask, num_tokens, "image_token_mask")
    if (to_physical_map is None) != (logical_count is None):
        raise ValueError("to_physical_map and logical_count must be given together")
    if to_physical_map is not None:
        if to_physical_map.dim() != 2 or to_physical_map.shape[0] != num_logical:
            raise ValueError(f"to_physical_map must have shape ({num_logical}, Dup), "
                             f"got {tuple(to_physical_map.shape)}")
        if tuple(logical_count.shape) != (num_logical,):
            raise ValueError(f"logical_count must have shape ({num_logical},), got {tuple(logical_count.shape)}")
    if unmapped_topk_idx is not None and tuple(unmapped_topk_idx.shape) != (num_tokens, num_topk):
        raise ValueError(f"unmapped_topk_idx must have shape ({num_tokens}, {num_topk}), "
                         f"got {tuple(unmapped_topk_idx.shape)}")
    if fix_routing_mask is not None and unmapped_topk_idx is None:
        raise ValueError("fix_routing_mask requires unmapped_topk_idx")

    no_rows = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    mask = _row_flags(mask, num_tokens, "mask")
    masked = no_rows if mask is None else ~mask
    force_random = _row_flags(force_random, num_tokens, "force_random")
    forced = no_rows if force_random is None else force_random & ~masked
    routed = ~masked & ~forced
    fix_routing_mask = _row_flags(fix_routing_mask, num_tokens, "fix_routing_mask")
    fixed = no_rows if fix_routing_mask is None else fix_routing_mask & routed

    topk_idx = torch.full((num_tokens, num_physical_topk), -1, dtype=torch.int64, device=device)
    topk_weights = torch.zeros((num_tokens, num_physical_topk), dtype=torch.float32, device=device)
    unmapped = torch.full((num_tokens, num_topk), -1, dtype=torch.int64, device=device)
    scores = torch.zeros((num_tokens, num_experts), dtype=torch.float32, device=device)

    if not bool(torch.isfinite(logits[routed]).all()):
        raise ValueError("logits of routed tokens must be finite (no NaN or inf)")
    if unbiased_scores is None:
        u = sqrt_softplus(logits[routed], flavor)
    else:
        if unbiased_scores.dtype != torch.float32 or unbiased_scores.shape != logits.shape:
            raise ValueError(f"unbiased_scores must be float32 of shape {tuple(logits.shape)}, "
                             f"got {unbiased_scores.dtype} of shape {tuple(unbiased_scores.shape)}")
        u = unbiased_scores[routed]

    beta = torch.zeros((num_tokens, num_experts), dtype=torch.float32, device=device)
    if bias is not None:
        beta = bias.expand(num_tokens, num_experts)
    if image_bias is not None:
        beta = torch.where(image_token_mask[:, None], image_bias, beta)
    selected = stable_topk(u + beta[routed], num_topk)
    if fix_routing_mask is not None:
        given = unmapped_topk_idx.to(torch.int64)
        if bool((fixed[:, None] & ((given < 0) | (given >= num_experts))).any()):
            raise ValueError(f"unmapped_topk_idx of fixed-routing tokens must lie in [0, {num_experts})")
        selected = torch.where(fixed[routed][:, None], given[routed], selected)

    values = torch.gather(u, 1, selected)
    scale = torch.tensor(routed_scaling_factor, dtype=torch.float32, device=device)
    routed_weights = values / denominator(values, flavor)[:, None] * scale
    num_routed = selected.shape[0]
    shared_ids = num_experts + torch.arange(num_shared, dtype=torch.int64, device=device)
    logical = torch.cat([selected, shared_ids.expand(num_routed, num_shared)], dim=1)
    shared_weights = torch.ones((num_routed, num_shared), dtype=torch.float32, device=device)
    weights = torch.cat([routed_weights, shared_weights], dim=1)

    physical = logical
    if to_physical_map is not None:
        counts = logical_count.to(torch.int64)[logical]
        if bool(((counts < 1) | (counts > to_physical_map.shape[1])).any()):
            raise ValueError(f"logical_count of the chosen experts must lie in [1, {to_physical_map.shape[1]}]")
        tokens = torch.arange(num_tokens, dtype=torch.int64, device=device)[routed]
        # int64 and a non-negative modulo: the int32 kernel formula wraps from t = 92037 on (spec §11.2).
        replica = torch.remainder(ep_rank + tokens[:, None] * REPLICA_STRIDE, counts)
        physical = to_physical_map.to(torch.int64)[logical, replica]

    topk_idx[routed] = physical
    topk_weights[routed] = weights
    unmapped[routed] = selected
    scores[routed] = u

    if force_random is not None:
        num_physical = num_logical if logical_count is None else int(logical_count.to(torch.int64).sum())
        if num_physical < num_physical_topk:
            raise ValueError(f"force_random needs at least {num_physical_topk} physical experts, got {num_physical}")
        if bool(forced.any()):
            random_idx, random_weights = force_random_route(num_tokens, num_physical_topk, num_physical, ep_rank)
            topk_idx[forced] = random_idx.to(device)[forced]
            topk_weights[forced] = random_weights.to(device)[forced]
    return topk_idx, topk_weights, unmapped, scores
