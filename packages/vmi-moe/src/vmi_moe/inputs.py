"""Validation of the MoE ops' arguments (the generic checks are vmi_core.checks).

Everything here runs before any kernel: bad input raises ``TypeError`` (wrong type
or dtype) or ``ValueError`` (wrong shape, stride, device, size or option) naming
the argument, and no output is written.
"""

from __future__ import annotations

import functools

import torch

from vmi_core.checks import INT32_MAX, check_int, check_tensor
from vmi_core.plan import with_values

from .kernels.common import STATUS_BAD_COUNT, STATUS_BAD_INDEX, STATUS_NONFINITE, STATUS_OVERFLOW, STATUS_WORDS

SCORING_FUNCS = ("sqrtsoftplus",)
MAX_TOPK = 32


def check_scoring_func(op: str, scoring_func) -> None:
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"{op}: scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")


def check_topk(num_topk, num_experts: int, name: str = "num_topk") -> int:
    num_topk = check_int(num_topk, name, 1, MAX_TOPK)
    if num_topk > num_experts:
        raise ValueError(f"{name} ({num_topk}) must not exceed the number of experts ({num_experts})")
    return num_topk


def check_ids(ids, name: str) -> tuple[int, int]:
    """``(T, K)`` of a contiguous int64 ``[T, K]`` id tensor, ``1 <= K <= 32``, whose int32 words the
    kernels address with 32-bit offsets."""
    check_tensor(ids, name, dtype=torch.int64, shape=(None, None), contiguous=True)
    num_tokens, num_topk = ids.shape
    if not 1 <= num_topk <= MAX_TOPK:
        raise ValueError(f"{name} must have 1 to {MAX_TOPK} columns, got {num_topk}")
    if 2 * num_tokens * num_topk > INT32_MAX:
        raise ValueError(f"{name} has too many entries ({num_tokens} x {num_topk}): the kernels address its "
                         f"int32 words with 32-bit offsets (at most {INT32_MAX // 2} entries)")
    return num_tokens, num_topk


def new_status(device: torch.device) -> torch.Tensor:
    """The status words a kernel raises flags in (see ``vmi_moe.kernels.common``)."""
    return torch.zeros(STATUS_WORDS, dtype=torch.int32, device=device)


def raise_status(status: torch.Tensor, op: str, values: str, indices: str = "", capacity: str = "",
                 nonfinite: str = "", id_bound: str = "num_experts") -> None:
    """Raise ``ValueError`` naming the arguments for every flag the kernel raised (one device sync).

    ``values``: the argument whose non-finite entries the kernel flags (``nonfinite``: the message,
    where the op flags something else than NaN and infinities); ``indices``: the argument whose
    ids it flags (below ``id_bound``); ``capacity``: the argument that sized a layout the kernel found
    too small.
    A planned call (``vmi_core.plan``) checks them again.
    """
    with_values(status, functools.partial(_raise_flags, op=op, values=values, indices=indices, capacity=capacity,
                                          nonfinite=nonfinite, id_bound=id_bound))


# Ops whose expert ids may be -1 (an unused slot).
_UNUSED_SLOT_OPS = ("moe_topk_gate_backward", "get_fused_mapping", "group_count", "aux_fi")


def _raise_flags(words: list[int], op: str, values: str, indices: str, capacity: str, nonfinite: str,
                 id_bound: str) -> None:
    errors = []
    if words[STATUS_NONFINITE]:
        errors.append(nonfinite or f"{values} contains non-finite values (NaN or +-inf) where {op} reads them")
    if words[STATUS_BAD_INDEX]:
        errors.append(f"{indices} holds ids outside [0, {id_bound}) (-1 marks an unused slot)"
                      if op in _UNUSED_SLOT_OPS else
                      f"{indices} holds fixed-routing experts outside [0, num_experts)")
    if words[STATUS_OVERFLOW]:
        errors.append(f"{capacity} is too small for the layout")
    if words[STATUS_BAD_COUNT]:
        errors.append("logical_count holds replica counts outside [1, to_physical_map.size(1)], or force-random "
                      "routing has fewer physical experts than slots")
    if errors:
        raise ValueError(f"{op}: " + "; ".join(errors))
