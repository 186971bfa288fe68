"""``topk_gate``: public dispatch (validation, allocation, backend choice).

Plain top-k over expert scores: row-wise, the ``num_topk`` largest scores in
descending order, equal scores by ascending expert index. Names and parameters
follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import randn

from ..inputs import check_topk, new_status, raise_status
from ..kernels import topk_gate as parallel
from ..reference import topk as reference
from .demo import SHAPES, SOURCE_EXPERTS, SUPPORT


@dataclass
class TopkGateCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.TopkGateSpec
    scores: torch.Tensor
    topk_idx: torch.Tensor
    status: torch.Tensor


def _run(scores, num_topk, *, out, target, flavor, launch):
    target = resolve_target(scores, target)
    # No bit of topk_gate depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    check_tensor(scores, "scores", dtype=torch.float32, shape=(None, None), contiguous=True)
    num_tokens, num_experts = scores.shape
    if num_experts == 0:
        raise ValueError("scores must have at least one expert column")
    num_topk = check_topk(num_topk, num_experts)
    topk_idx = torch.empty(num_tokens, num_topk, dtype=torch.int64, device=scores.device)
    if not launch or num_tokens == 0:
        return topk_idx
    if target == "torch":
        return topk_idx.copy_(reference.topk_gate(scores, num_topk))
    call = TopkGateCall(parallel.TopkGateSpec(num_experts, num_topk), scores, topk_idx, new_status(scores.device))
    parallel.launch(call, target)
    raise_status(call.status, "topk_gate", "scores")
    return topk_idx


def _inputs(shape, options, seed):
    return {"scores": randn(shape, seed)}


def _kernels(options, target, flavor):
    return [(parallel.build_topk_gate, parallel.TopkGateSpec(SOURCE_EXPERTS, options["num_topk"]))]


TOPK_GATE = KernelOp(
    "topk_gate", (Param("scores", "Tensor"), Param("num_topk", "int")), ("topk_idx",), _run,
    command=Command(
        summary="top-k expert indices per token, ties to the lowest index",
        support=SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=SHAPES,
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "experts per token"),),
    ))


def topk_gate(scores: torch.Tensor, num_topk: int, *, target: str | None = None,
              flavor: str | None = None) -> torch.Tensor:
    """Indices of each row's ``num_topk`` largest scores.

    Rank order: descending score, equal scores by ascending index. Every score of every row
    must be finite: NaN and +-inf (-inf too; exclude an expert with a very negative finite
    score) raise ``ValueError`` after the kernel ran (the reference ``"torch"`` checks before
    it computes).

    Args:
        scores: Contiguous fp32 ``[T, E]``, ``E >= 1``.
        num_topk: Experts per row, ``1 <= num_topk <= min(E, 32)``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``scores``.
        flavor: Bit conventions, ``"ascend"`` or ``"cuda"``; checked like every op's (only
            choosable on ``cpu`` and ``torch``) but no bit of ``topk_gate`` depends on it.

    Returns:
        New int64 ``[T, num_topk]`` expert indices, best first.

    Raises:
        TypeError: ``scores`` is not an fp32 tensor; ``num_topk`` is not an int.
        ValueError: ``scores`` is not 2-D or not contiguous, or has no expert column;
            ``num_topk`` is outside ``[1, min(E, 32)]``.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran: ``scores`` holds a NaN or an infinity.
    """
    return TOPK_GATE(scores, num_topk, target=target, flavor=flavor)


topk_gate_parallel = parallel_entry(topk_gate, "scores")
