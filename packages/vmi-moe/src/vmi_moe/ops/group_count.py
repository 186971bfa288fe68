"""``group_count``: public dispatch (validation, allocation, backend choice).

The number of entries of an int64 id tensor equal to each group (``docs/moe/group_count.md``).
Names and parameters follow TileKernels; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_int
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target

from ..inputs import check_ids, new_status, raise_status
from ..kernels import group_count as parallel
from ..kernels.get_fused_mapping import build_fused_mapping_count
from ..reference import counts as reference
from .demo import SIMT_SUPPORT, SOURCE_EXPERTS, routing
from .get_fused_mapping import MAX_EXPERTS


@dataclass
class GroupCountCall:
    """A validated call: the tensors the kernels read and write."""

    group_idx: torch.Tensor
    counts: torch.Tensor
    status: torch.Tensor


def _run(group_idx, num_groups, *, out, target, flavor, launch):
    target = resolve_target(group_idx, target)
    # No bit of the counts depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    check_ids(group_idx, "group_idx")
    num_groups = check_int(num_groups, "num_groups", 1, MAX_EXPERTS)
    counts = torch.empty(num_groups, dtype=torch.int32, device=group_idx.device)
    if not launch:
        return counts
    if target == "torch":
        return counts.copy_(reference.group_count(group_idx, num_groups))
    call = GroupCountCall(group_idx, counts, new_status(group_idx.device))
    parallel.launch_group_count(call, target)
    raise_status(call.status, "group_count", "", "group_idx", id_bound="num_groups")
    return counts


def _inputs(shape, options, seed):
    return {"group_idx": routing(shape, options, seed), "num_groups": shape[1]}


def _kernels(options, target, flavor):
    return [(build_fused_mapping_count, parallel.count_spec(SOURCE_EXPERTS, options["num_topk"])),
            (parallel.build_count_sum, parallel.CountSumSpec(SOURCE_EXPERTS, parallel.COUNTS))]


# The id columns the command offers (get_fused_mapping's).
TOPK_CHOICES = (1, 2, 6, 8, 16, 32)

GROUP_COUNT = KernelOp(
    "group_count",
    (Param("group_idx", "Tensor"), Param("num_groups", "int")),
    ("counts",),
    _run,
    command=Command(
        summary="entries per group (expert) of an id tensor",
        support=SIMT_SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=((16384, 256), (4096, 384), (1024, 72), (1, 256), (16, 256)),
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_topk", 8, TOPK_CHOICES, "ids per token"),),
    ))


def group_count(group_idx: torch.Tensor, num_groups: int, *, target: str | None = None,
                flavor: str | None = None) -> torch.Tensor:
    """The number of entries of ``group_idx`` equal to each group.

    ``counts[g]`` = the entries equal to ``g``; ``-1`` counts nowhere. Exact integers: the same bits
    on every target and thread count; an empty batch gives zeros.

    Args:
        group_idx: Contiguous int64 ``[T, K]`` ids in ``[-1, num_groups)``, ``1 <= K <= 32``, at most
            ``2^30 - 1`` entries; ``-1`` marks an unused slot.
        num_groups: ``G``, ``1 <= G <= 65536``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``group_idx``.
        flavor: Bit conventions (see ``vmi_core.targets``); checked like every op's, but no bit of the
            counts depends on it.

    Returns:
        counts: New int32 ``[G]``.

    Raises:
        TypeError: ``group_idx`` is not an int64 tensor; ``num_groups`` is not an int.
        ValueError: ``group_idx`` is not 2-D or not contiguous, has fewer than 1 or more than 32
            columns or too many entries; ``num_groups`` is out of range.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran: ``group_idx`` holds an id outside ``[-1, G)``.
    """
    return GROUP_COUNT(group_idx, num_groups, target=target, flavor=flavor)


group_count_parallel = parallel_entry(group_count, "group_idx")
