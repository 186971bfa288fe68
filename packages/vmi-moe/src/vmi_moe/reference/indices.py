"""PyTorch references of the index masks (``docs/moe/mask_indices_by_tp.md``,
``docs/moe/inplace_unique_group_indices.md``).

Written from the pages' definitions, in int64 arithmetic on whole tensors, not from the kernels:
``mask_indices_by_tp`` evaluates TileKernels' formula as written (floor divisions, the final
``-1`` for a negative result), ``unique_group_indices`` compares every entry with every earlier
entry of its row.
"""

import torch

# Ids of mask_indices_by_tp are taken as 32-bit values by the kernels: larger ones are refused.
MAX_TP_ID = 2**31 - 1


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """``indices`` (int32 or int64, any shape) with the ids of other TP ranks ``-1`` and the kept ones
    renumbered to the rank's local experts; a new tensor of the same dtype and shape.

    With ``per_gpu = n // num_ep_ranks`` and ``per_dp = num_tp_ranks * per_gpu``, per id ``v``:
    ``-1`` if ``v < 0`` or ``(v // per_gpu) % num_tp_ranks != tp_rank``; else ``w = v - tp_rank *
    per_gpu``, ``w - (w // per_dp) * (per_dp - per_gpu)``, and ``-1`` if that is negative.

    Raises:
        ValueError: An id above ``2^31 - 1``.
    """
    if indices.numel() and int(indices.max()) > MAX_TP_ID:
        raise ValueError(f"indices holds ids above 2^31 - 1 ({MAX_TP_ID}); mask_indices_by_tp takes 32-bit "
                         f"expert ids")
    per_gpu = n // num_ep_ranks
    per_dp = num_tp_ranks * per_gpu
    v = indices.to(torch.int64)
    other_rank = (v < 0) | (torch.div(v, per_gpu, rounding_mode="floor") % num_tp_ranks != tp_rank)
    w = v - tp_rank * per_gpu
    w = w - torch.div(w, per_dp, rounding_mode="floor") * (per_dp - per_gpu)
    return torch.where(other_rank | (w < 0), -1, w).to(indices.dtype)


def unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``group_indices [T, K]`` (int64) with every entry equal to an earlier entry of its row set to ``-1``
    (the first occurrence stays, ``-1`` stays ``-1``); a new tensor.

    Raises:
        ValueError: An entry outside ``[-1, num_groups)``.
    """
    if ((group_indices < -1) | (group_indices >= num_groups)).any():
        raise ValueError(f"group_indices holds group ids outside [-1, {num_groups}) (-1 marks an unused slot)")
    num_topk = group_indices.shape[1]
    # seen_before[t, j, i]: entry i < j of row t equals entry j.
    equal = group_indices.unsqueeze(2) == group_indices.unsqueeze(1)
    earlier = torch.ones(num_topk, num_topk, dtype=torch.bool, device=group_indices.device).tril(-1)
    repeated = (equal & earlier).any(dim=2)
    return torch.where(repeated, -1, group_indices)


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """``unique_group_indices`` written into ``group_indices`` (left unchanged when it raises)."""
    group_indices.copy_(unique_group_indices(group_indices, num_groups))
