"""``get_fused_mapping``: public dispatch (validation, allocation, backend choice).

The expert-major ("fused") layout of a batch's routed slots: each expert owns a range of rows
rounded up to ``alignment``, its slots fill the range in ascending ``token * num_topk + k`` and
the rest is padding (``docs/moe/get_fused_mapping.md``). Names and parameters follow TileKernels;
``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_bool, check_int
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.plan import with_values
from vmi_core.targets import resolve_flavor, resolve_target

from ..inputs import check_ids, new_status, raise_status
from ..kernels import get_fused_mapping as parallel
from ..reference import mapping as reference
from .demo import SIMT_SUPPORT, SOURCE_EXPERTS, routing

# Expert ids are compile-time sizes of the kernels' counter tiles.
MAX_EXPERTS = 65536
# The most rows one expert's range may be rounded up to.
MAX_ALIGNMENT = 65536

FusedMapping = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                     torch.Tensor, list[int]]


@dataclass
class FusedMappingCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.FusedMappingSpec
    topk_idx: torch.Tensor
    alignment: int
    pos_to_expert: torch.Tensor
    pos_to_token: torch.Tensor
    pos_to_token_topk: torch.Tensor
    token_topk_to_pos: torch.Tensor
    expert_start: torch.Tensor
    expert_end: torch.Tensor
    num_tokens_per_expert: torch.Tensor
    status: torch.Tensor


def rows_bound(num_slots: int, num_experts: int, alignment: int) -> int:
    """The most rows a layout of ``num_slots`` slots can need: every expert's range rounded up."""
    return -(-(num_slots + (alignment - 1) * num_experts) // alignment) * alignment


def _run(topk_idx, num_experts, num_expanded_tokens, alignment, *, out, target, flavor, launch):
    target = resolve_target(topk_idx, target)
    # No bit of the layout depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    num_tokens, num_topk = check_ids(topk_idx, "topk_idx")
    num_experts = check_int(num_experts, "num_experts", 1, MAX_EXPERTS)
    alignment = check_int(alignment, "alignment", 1, MAX_ALIGNMENT)
    num_expanded_tokens = check_int(num_expanded_tokens, "num_expanded_tokens", 0, INT32_MAX)
    bound = rows_bound(num_tokens * num_topk, num_experts, alignment)
    if bound > INT32_MAX:
        raise ValueError(f"topk_idx has too many slots ({num_tokens} x {num_topk}) for 32-bit row numbers "
                         f"with {num_experts} experts aligned to {alignment}")
    rows = num_expanded_tokens or bound
    device = topk_idx.device
    outputs = [torch.empty(rows, dtype=torch.int32, device=device) for _ in range(3)]
    outputs.append(torch.empty(num_tokens, num_topk, dtype=torch.int32, device=device))
    outputs += [torch.empty(num_experts, dtype=torch.int32, device=device) for _ in range(3)]
    if not launch:
        return tuple(outputs)
    if target == "torch":
        for output, expected in zip(outputs, reference.get_fused_mapping(topk_idx, num_experts, rows, alignment),
                                    strict=True):
            output.copy_(expected)
        return tuple(outputs)
    call = FusedMappingCall(parallel.FusedMappingSpec(num_experts, num_topk), topk_idx, alignment, *outputs,
                            new_status(device))
    parallel.launch(call, target)
    raise_status(call.status, "get_fused_mapping", "", "topk_idx", "num_expanded_tokens")
    return tuple(outputs)


def _inputs(shape, options, seed):
    return {"topk_idx": routing(shape, options, seed), "num_experts": shape[1], "num_expanded_tokens": 0,
            "alignment": options["alignment"]}


def _kernels(options, target, flavor):
    spec = parallel.FusedMappingSpec(SOURCE_EXPERTS, options["num_topk"])
    return [(parallel.build_fused_mapping_count, spec),
            (parallel.build_fused_mapping_layout, parallel.FusedLayoutSpec(SOURCE_EXPERTS)),
            (parallel.build_fused_mapping_place, spec)]


GET_FUSED_MAPPING = KernelOp(
    "get_fused_mapping",
    (Param("topk_idx", "Tensor"), Param("num_experts", "int"), Param("num_expanded_tokens", "int"),
     Param("alignment", "int")),
    ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end",
     "num_tokens_per_expert"),
    _run,
    command=Command(
        summary="expert-major layout of the routed slots, ranges aligned per expert",
        support=SIMT_SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=((16384, 256), (4096, 384), (1024, 72), (1, 256), (16, 256)),
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_topk", 8, (1, 2, 6, 8, 16, 32), "experts per token"),
                 Option("alignment", 128, (1, 16, 64, 128), "rows each expert's range is rounded up to")),
    ))


def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int,
                      force_no_sync: bool = False, *, target: str | None = None,
                      flavor: str | None = None) -> FusedMapping:
    """The expert-major layout of the routed slots ``topk_idx`` and the maps between the two.

    Expert ``e`` owns rows ``[expert_start[e], expert_end[e])``: its slot count rounded up to
    ``alignment``, the ranges in expert order from row 0. Its slots fill the range in ascending flat
    slot index ``token * num_topk + k`` (the same rows on every target and thread count); the rest
    of the range, and every row past the last range, is padding: ``-1`` in the three row maps.

    Args:
        topk_idx: Contiguous int64 ``[T, K]`` expert ids, ``1 <= K <= 32``; ``-1`` marks an unused slot
            (placed nowhere).
        num_experts: ``E``, ``1 <= E <= 65536``.
        num_expanded_tokens: Rows of the layout. ``0``: the most any routing can need,
            ``align(T * K + (alignment - 1) * E, alignment)``, trimmed to the rows the layout uses unless
            ``force_no_sync``.
        alignment: Rows each expert's range is rounded up to, ``1 <= alignment <= 65536``.
        force_no_sync: With ``num_expanded_tokens = 0``, keep the untrimmed row maps and return an empty
            count list, so that no host synchronization is needed for the sizes.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``topk_idx``.
        flavor: Bit conventions (see ``vmi_core.targets``); checked like every op's, but no bit of the
            layout depends on it.

    Returns:
        pos_to_expert: New int32 ``[N]``: each row's expert, ``-1`` for padding.
        pos_to_token: New int32 ``[N]``: each row's token, ``-1`` for padding.
        pos_to_token_topk: New int32 ``[N]``: each row's flat slot ``token * K + k``, ``-1`` for padding.
        token_topk_to_pos: New int32 ``[T, K]``: each slot's row, ``-1`` for an unused slot.
        expert_start: New int32 ``[E]``.
        expert_end: New int32 ``[E]``.
        num_tokens_per_expert: New int32 ``[E]``: the range sizes, ``expert_end - expert_start`` (slot
            counts rounded up to ``alignment``).
        num_tokens_per_expert_list: ``num_tokens_per_expert`` as a list where the rows were trimmed,
            else ``[]``.

    Raises:
        TypeError: ``topk_idx`` is not an int64 tensor; ``num_experts``, ``num_expanded_tokens`` or
            ``alignment`` is not an int; ``force_no_sync`` is not a bool.
        ValueError: ``topk_idx`` is not 2-D or not contiguous, or has fewer than 1 or more than 32
            columns; ``num_experts``, ``num_expanded_tokens`` or ``alignment`` is out of range; the
            row numbers of the largest layout would not fit 32 bits.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran: ``topk_idx`` holds an id outside ``[-1, E)``, or the layout
            needs more than ``num_expanded_tokens`` rows.
    """
    force_no_sync = check_bool(force_no_sync, "force_no_sync")
    outputs = GET_FUSED_MAPPING(topk_idx, num_experts, num_expanded_tokens, alignment, target=target, flavor=flavor)
    if num_expanded_tokens != 0 or force_no_sync:
        return (*outputs, [])
    # The host synchronization TileKernels makes here (outside the op: a plan does not repeat it).
    sizes = []
    with_values(outputs[6], sizes.extend)
    used = sum(sizes)
    return (*(rows[:used] for rows in outputs[:3]), *outputs[3:], sizes)


get_fused_mapping_parallel = parallel_entry(get_fused_mapping, "topk_idx")
