"""PyTorch references of ``group_count`` and ``aux_fi`` (``docs/moe/group_count.md``, ``docs/moe/aux_fi.md``).

Written from the definitions, not from the kernels: ``counts[g]`` is the number of entries equal to
``g`` (``-1`` counts nowhere); ``fi[e] = count[e] * E / (T * num_aux_topk)`` with the integer
products exact (int64), each converted to fp32 once (round to nearest even) and one IEEE fp32
division; an empty batch gives zeros.
"""

import torch


def _counts(ids: torch.Tensor, num_ids: int, name: str) -> torch.Tensor:
    """int64 ``[num_ids]``: the entries of ``ids`` equal to each id; ids outside ``[-1, num_ids)`` raise."""
    flat = ids.reshape(-1).to(torch.int64)
    if ((flat < -1) | (flat >= num_ids)).any():
        raise ValueError(f"{name} holds ids outside [-1, {num_ids})")
    return torch.bincount(flat[flat >= 0], minlength=num_ids)


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 ``[num_groups]``: the entries of int64 ``group_idx [T, K]`` equal to each group (``-1``: none).

    Raises:
        ValueError: An entry of ``group_idx`` outside ``[-1, num_groups)``.
    """
    return _counts(group_idx, num_groups, "group_idx").to(torch.int32)


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """fp32 ``[num_experts]``: ``fl(count[e] * E) / fl(T * num_aux_topk)``, zeros for ``T = 0``.

    Raises:
        ValueError: An entry of ``topk_idx`` outside ``[-1, num_experts)``.
    """
    return frequencies(_counts(topk_idx, num_experts, "topk_idx"), num_experts, topk_idx.shape[0], num_aux_topk)


def frequencies(counts: torch.Tensor, num_experts: int, num_tokens: int, num_aux_topk: int) -> torch.Tensor:
    """fp32 ``fl(counts * E) / fl(T * num_aux_topk)`` of integer ``counts`` (any shape), zeros for
    ``T = 0``: ``aux_fi`` from counts, e.g. counts summed over the ranks that hold parts of a batch."""
    if num_tokens == 0:
        return torch.zeros(counts.shape, dtype=torch.float32, device=counts.device)
    numerator = (counts.to(torch.int64) * num_experts).to(torch.float32)
    denominator = torch.tensor(num_tokens * num_aux_topk, dtype=torch.int64, device=counts.device).to(torch.float32)
    return numerator / denominator
