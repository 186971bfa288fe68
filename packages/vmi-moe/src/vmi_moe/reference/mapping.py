"""PyTorch reference of the fused expert layout (``docs/moe/get_fused_mapping.md``).

Written from the layout's definition, not from the kernel: expert ``e``'s range starts where the
ranges of the experts before it end, each range is its expert's slot count rounded up to
``alignment``, and an expert's slots fill its range in ascending flat slot index
``token * num_topk + k``; the rest of the range, and every row past the last range, is padding.
"""

import torch

FusedMapping = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                     torch.Tensor]


def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int,
                      alignment: int) -> FusedMapping:
    """``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
    num_tokens_per_expert)`` of int64 ``topk_idx [T, K]`` (``-1`` = no expert) for ``num_expanded_tokens``
    rows; every tensor int32, padding ``-1``.

    Raises:
        ValueError: An entry of ``topk_idx`` outside ``[-1, num_experts)``, or ranges that need more
            than ``num_expanded_tokens`` rows.
    """
    num_tokens, num_topk = topk_idx.shape
    flat = topk_idx.reshape(-1).to(torch.int64)
    if ((flat < -1) | (flat >= num_experts)).any():
        raise ValueError(f"topk_idx holds expert ids outside [-1, {num_experts})")
    placed = flat >= 0
    counts = torch.bincount(flat[placed], minlength=num_experts)
    sizes = (counts + alignment - 1) // alignment * alignment
    expert_end = torch.cumsum(sizes, 0)
    expert_start = expert_end - sizes
    needed = int(expert_end[-1]) if num_experts else 0
    if needed > num_expanded_tokens:
        raise ValueError(f"num_expanded_tokens ({num_expanded_tokens}) is too small: the layout needs {needed} rows")

    # A stable sort by expert keeps each expert's slots in ascending flat index; a slot's rank among
    # its expert's is its place in the sorted order less the slots of the experts before it.
    slots = torch.nonzero(placed).flatten()
    experts = flat[slots]
    order = torch.sort(experts, stable=True).indices
    slots, experts = slots[order], experts[order]
    ranks = torch.arange(slots.numel(), device=flat.device) - (torch.cumsum(counts, 0) - counts)[experts]
    positions = expert_start[experts] + ranks

    pos_to_expert = torch.full((num_expanded_tokens,), -1, dtype=torch.int32, device=flat.device)
    pos_to_token = torch.full((num_expanded_tokens,), -1, dtype=torch.int32, device=flat.device)
    pos_to_token_topk = torch.full((num_expanded_tokens,), -1, dtype=torch.int32, device=flat.device)
    token_topk_to_pos = torch.full((num_tokens * num_topk,), -1, dtype=torch.int32, device=flat.device)
    pos_to_expert[positions] = experts.to(torch.int32)
    pos_to_token[positions] = (slots // num_topk).to(torch.int32)
    pos_to_token_topk[positions] = slots.to(torch.int32)
    token_topk_to_pos[slots] = positions.to(torch.int32)
    return (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos.view(num_tokens, num_topk),
            expert_start.to(torch.int32), expert_end.to(torch.int32), sizes.to(torch.int32))
