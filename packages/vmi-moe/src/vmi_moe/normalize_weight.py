"""``normalize_weight``: public dispatch (validation, allocation, backend choice).

Renormalises selected expert weights row by row: ``D = sum(w) + 1e-20`` and
``w / D``, summed in the order the gate sums its own denominator (``flavor``), so
that renormalising the gate's selected scores reproduces its denominator bit for
bit. Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are
vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_tensor
from vmi_core.library import KernelOp, Param
from vmi_core.targets import resolve_flavor, resolve_target

from . import normalize_weight_parallel as parallel
from .inputs import MAX_TOPK
from .reference import normalize as reference


@dataclass
class NormalizeWeightCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.NormalizeWeightSpec
    weights: torch.Tensor
    denominator: torch.Tensor
    normalized: torch.Tensor


def _run(topk_weights, *, out, target, flavor, launch):
    target = resolve_target(topk_weights, target)
    flavor = resolve_flavor(target, flavor)
    check_tensor(topk_weights, "topk_weights", dtype=torch.float32, shape=(None, None), contiguous=True)
    num_rows, num_topk = topk_weights.shape
    if not 1 <= num_topk <= MAX_TOPK:
        raise ValueError(f"topk_weights must have 1 to {MAX_TOPK} columns, got {num_topk}")
    denominator = torch.empty(num_rows, dtype=torch.float32, device=topk_weights.device)
    normalized = torch.empty_like(topk_weights)
    if launch and target == "torch":
        expected_denominator, expected = reference.normalize_weight(topk_weights, flavor.name)
        denominator.copy_(expected_denominator)
        normalized.copy_(expected)
    elif launch and num_rows:
        call = NormalizeWeightCall(parallel.NormalizeWeightSpec(num_topk, flavor.name), topk_weights, denominator,
                                   normalized)
        parallel.launch(call, target)
    return denominator, normalized


NORMALIZE_WEIGHT = KernelOp("normalize_weight", (Param("topk_weights", "Tensor"),), ("denominator", "normalized"),
                            _run)


def normalize_weight(topk_weights: torch.Tensor, *, target: str | None = None,
                     flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(denominator [T], normalized [T, K])`` of contiguous fp32 ``topk_weights [T, K]``, K <= 32.

    ``denominator = sum(w) + 1e-20`` (all-zero rows give 0, not NaN) summed left to
    right (ascend flavor) or in the 32-lane xor-butterfly order (cuda flavor);
    ``normalized = w / denominator``, correctly rounded. Negative weights are allowed.
    """
    return NORMALIZE_WEIGHT(topk_weights, target=target, flavor=flavor)
