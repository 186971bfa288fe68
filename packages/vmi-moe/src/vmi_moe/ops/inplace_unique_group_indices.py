"""``inplace_unique_group_indices``: public dispatch (validation, backend choice).

Per token, every group id equal to an earlier one of its row becomes ``-1``, in place
(``docs/moe/inplace_unique_group_indices.md``). Names and parameters follow TileKernels; ``target``
and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_int, check_tensor, mark_written
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.plan import with_values
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MAX_TOPK, new_status
from ..kernels import inplace_unique_group_indices as parallel
from ..kernels.common import STATUS_BAD_INDEX
from ..reference import indices as reference
from .demo import SIMD_SIMT_SUPPORT

# The largest group count: ids are compared as int32.
MAX_GROUPS = INT32_MAX



@dataclass
class UniqueGroupCall:
    """A validated call: the kernel specialisation, the caller's ids (read) and the scratch tensor the
    kernel writes (copied over the ids when no flag is set)."""

    spec: parallel.UniqueGroupSpec
    group_indices: torch.Tensor
    staged: torch.Tensor
    status: torch.Tensor
    num_groups: int


def _raise_flags(words: list[int], num_groups: int) -> None:
    if words[STATUS_BAD_INDEX]:
        raise ValueError(f"inplace_unique_group_indices: group_indices holds group ids outside [-1, {num_groups}) "
                         f"(-1 marks an unused slot); group_indices is left unchanged")


def _run(group_indices, num_groups, *, out, target, flavor, launch) -> None:
    target = resolve_target(group_indices, target)
    # No bit of the result depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    check_tensor(group_indices, "group_indices", dtype=torch.int64, shape=(None, None), contiguous=True)
    num_tokens, num_topk = group_indices.shape
    if not 1 <= num_topk <= MAX_TOPK:
        raise ValueError(f"group_indices must have 1 to {MAX_TOPK} columns, got {num_topk}")
    num_groups = check_int(num_groups, "num_groups", 1, MAX_GROUPS)
    if not launch or num_tokens == 0:
        return
    if target == "torch":
        reference.inplace_unique_group_indices(group_indices, num_groups)
        mark_written(group_indices)
        return
    # The kernel writes a scratch tensor: the caller's ids change only once the flags are clear.
    call = UniqueGroupCall(parallel.UniqueGroupSpec(num_topk), group_indices, torch.empty_like(group_indices),
                           new_status(group_indices.device), num_groups)
    parallel.launch(call, target)
    with_values(call.status, functools.partial(_raise_flags, num_groups=num_groups))
    group_indices.copy_(call.staged)
    mark_written(group_indices)


def _inputs(shape, options, seed):
    """Group ids drawn from ``[0, num_groups)`` with repeats (a token's experts often share a group),
    about 5% of the slots unused (-1)."""
    num_tokens, num_groups = shape
    g = generator(seed)
    group_indices = torch.randint(0, num_groups, (num_tokens, options["num_topk"]), generator=g)
    group_indices[torch.rand(group_indices.shape, generator=g) < 0.05] = -1
    return {"group_indices": group_indices, "num_groups": num_groups}


def _kernels(options, target, flavor):
    return [(parallel.build_inplace_unique_group_indices, parallel.UniqueGroupSpec(options["num_topk"]))]


INPLACE_UNIQUE_GROUP_INDICES = KernelOp(
    "inplace_unique_group_indices",
    (Param("group_indices", "Tensor", mutable=True), Param("num_groups", "int")),
    (), _run,
    command=Command(
        summary="per token, set every group id that repeats an earlier one to -1, in place",
        support=SIMD_SIMT_SUPPORT,
        default_shape=(4096, 16),
        bench_shapes=((16384, 16), (4096, 8), (4096, 128), (1, 16), (16, 16)),
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "group ids per token"),),
    ))


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int, *, target: str | None = None,
                                 flavor: str | None = None) -> None:
    """Per token, set every group id equal to an earlier id of its row to ``-1``, in place.

    The first occurrence of each group in a row stays where it is; ``-1`` (an unused slot) stays
    ``-1``; nothing is reordered. ``[[3, 1, 3, -1, 1, 0]]`` becomes ``[[3, 1, -1, -1, -1, 0]]``.

    Args:
        group_indices: Contiguous int64 ``[T, K]`` group ids in ``[-1, num_groups)``, ``1 <= K <= 32``;
            rewritten in place.
        num_groups: Groups, ``1 <= num_groups <= 2^31 - 1`` (no bitmask: any count).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``group_indices``.
        flavor: Bit conventions (see ``vmi_core.targets``); checked like every op's, but no bit of the
            result depends on it.

    Returns:
        None; ``group_indices`` holds the result.

    Raises:
        TypeError: ``group_indices`` is not an int64 tensor; ``num_groups`` is not an int.
        ValueError: ``group_indices`` is not 2-D or not contiguous, or has fewer than 1 or more than 32
            columns; ``num_groups`` is out of range.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran (the reference ``"torch"`` raises the same before writing):
            ``group_indices`` holds an id outside ``[-1, num_groups)``; ``group_indices`` is then left
            unchanged.
    """
    INPLACE_UNIQUE_GROUP_INDICES(group_indices, num_groups, target=target, flavor=flavor)


inplace_unique_group_indices_parallel = parallel_entry(inplace_unique_group_indices, "group_indices")
