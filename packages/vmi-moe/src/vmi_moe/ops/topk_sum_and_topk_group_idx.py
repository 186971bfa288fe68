"""``topk_sum_and_topk_group_idx``: public dispatch (validation, allocation, backend choice).

Group-limited routing's first step: score each group of experts by its largest score (or the sum
of its two largest) and rank the groups (``docs/moe/topk_sum_and_topk_group_idx.md``). Names and
parameters follow TileKernels; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_int, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import randn

from ..inputs import new_status, raise_status
from ..kernels import topk_sum_and_topk_group_idx as parallel
from ..reference import topk as reference
from .demo import SHAPES, SIMD_SIMT_SUPPORT

# Each token ranks its groups against each other: G^2 compares.
MAX_GROUPS = 256
NAN_MESSAGE = ("scores holds a NaN, or a group whose two largest scores are +inf and -inf (a NaN group score), "
               "which has no rank")


@dataclass
class TopkGroupCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.TopkGroupSpec
    scores: torch.Tensor
    topk_group_idx: torch.Tensor
    status: torch.Tensor


def _run(scores, num_topk_sum, num_topk_groups, *, out, target, flavor, launch):
    target = resolve_target(scores, target)
    # No bit depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    check_tensor(scores, "scores", dtype=torch.float32, shape=(None, None, None), contiguous=True)
    num_tokens, num_groups, experts_per_group = scores.shape
    if not 1 <= num_groups <= MAX_GROUPS or experts_per_group == 0:
        raise ValueError(f"scores must have 1 to {MAX_GROUPS} groups of at least one expert, "
                         f"got shape {tuple(scores.shape)}")
    num_topk_sum = check_int(num_topk_sum, "num_topk_sum", 1, 2)
    if num_topk_sum > experts_per_group:
        raise ValueError(f"num_topk_sum ({num_topk_sum}) must not exceed the experts per group ({experts_per_group})")
    num_topk_groups = check_int(num_topk_groups, "num_topk_groups", 1, num_groups)
    topk_group_idx = torch.empty(num_tokens, num_topk_groups, dtype=torch.int64, device=scores.device)
    if not launch or num_tokens == 0:
        return topk_group_idx
    if target == "torch":
        return topk_group_idx.copy_(reference.topk_sum_and_topk_group_idx(scores, num_topk_sum, num_topk_groups))
    spec = parallel.TopkGroupSpec(num_groups, experts_per_group, num_topk_sum, num_topk_groups)
    call = TopkGroupCall(spec, scores, topk_group_idx, new_status(scores.device))
    parallel.launch(call, target)
    raise_status(call.status, "topk_sum_and_topk_group_idx", "scores", nonfinite=NAN_MESSAGE)
    return topk_group_idx


def _groups(shape, options) -> tuple[int, int, int]:
    num_tokens, num_experts = shape
    num_groups = options["num_groups"]
    if num_experts % num_groups:
        raise ValueError(f"{num_experts} experts do not split into {num_groups} groups")
    return num_tokens, num_groups, num_experts // num_groups


def _inputs(shape, options, seed):
    return {"scores": randn(_groups(shape, options), seed), "num_topk_sum": options["num_topk_sum"],
            "num_topk_groups": options["num_topk_groups"]}


def _kernels(options, target, flavor):
    _, num_groups, experts_per_group = _groups((1, 256), options)
    return [(parallel.build_topk_sum_and_topk_group_idx,
             parallel.TopkGroupSpec(num_groups, experts_per_group, options["num_topk_sum"],
                                    options["num_topk_groups"]))]


TOPK_SUM_AND_TOPK_GROUP_IDX = KernelOp(
    "topk_sum_and_topk_group_idx",
    (Param("scores", "Tensor"), Param("num_topk_sum", "int"), Param("num_topk_groups", "int")),
    ("topk_group_idx",), _run,
    command=Command(
        summary="rank expert groups by their top-1 or top-2 score sum, ties to the lowest group",
        support=SIMD_SIMT_SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=SHAPES,
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_groups", 8, (1, 4, 8, 16, 32), "expert groups (the experts split evenly)"),
                 Option("num_topk_sum", 2, (1, 2), "largest scores summed per group"),
                 Option("num_topk_groups", 4, (1, 2, 4, 8), "groups kept per token")),
    ))


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int, *,
                                target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """The ``num_topk_groups`` best groups of experts of each token, best first.

    A group's score is its largest score (``num_topk_sum = 1``) or the fp32 sum of its two largest
    (``2``; equal maxima both count: ``[5, 5, 1]`` scores 10). Groups rank by descending score,
    equal scores by ascending group index. ``-inf`` and ``+inf`` scores rank like numbers; a NaN, or
    a group whose two largest are ``+inf`` and ``-inf``, raises ``ValueError`` after the kernel ran
    (the reference ``"torch"`` checks after it computes).

    Args:
        scores: Contiguous fp32 ``[T, G, P]``: ``G`` groups (1 to 256) of ``P`` experts.
        num_topk_sum: 1 or 2, at most ``P``.
        num_topk_groups: Groups kept per token, ``1 <= num_topk_groups <= G``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``scores``.
        flavor: Bit conventions (see ``vmi_core.targets``); checked like every op's, but no bit of the
            result depends on it.

    Returns:
        New int64 ``[T, num_topk_groups]`` group indices in rank order.

    Raises:
        TypeError: ``scores`` is not an fp32 tensor; ``num_topk_sum`` or ``num_topk_groups`` is not an int.
        ValueError: ``scores`` is not 3-D or not contiguous, or has no group, more than 256, or empty
            groups; ``num_topk_sum`` is not 1 or 2 or exceeds ``P``; ``num_topk_groups`` is outside
            ``[1, G]``.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran: a NaN score or NaN group score.
    """
    return TOPK_SUM_AND_TOPK_GROUP_IDX(scores, num_topk_sum, num_topk_groups, target=target, flavor=flavor)


topk_sum_and_topk_group_idx_parallel = parallel_entry(topk_sum_and_topk_group_idx, "scores")
