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
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MAX_TOPK
from ..kernels import normalize_weight as parallel
from ..reference import normalize as reference
from .demo import SUPPORT


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


def _inputs(shape, options, seed):
    return {"topk_weights": torch.rand(shape[0], options["num_topk"], generator=generator(seed))}


def _kernels(options, target, flavor):
    return [(parallel.build_normalize_weight, parallel.NormalizeWeightSpec(options["num_topk"], flavor))]


NORMALIZE_WEIGHT = KernelOp(
    "normalize_weight", (Param("topk_weights", "Tensor"),), ("denominator", "normalized"), _run,
    command=Command(
        summary="renormalise selected expert weights, summed in the gate's order",
        support=SUPPORT,
        default_shape=(16384, 8),
        bench_shapes=((65536, 8), (16384, 8), (4096, 6), (1, 8), (4, 8), (16, 8)),
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_topk", 8, tuple(range(1, 33)), "weights per row"),),
    ))


def normalize_weight(topk_weights: torch.Tensor, *, target: str | None = None,
                     flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Renormalise each row of ``topk_weights``: ``(denominator, w / denominator)``.

    ``denominator = sum(w) + 1e-20`` (all-zero rows give 0, not NaN) summed left to
    right (ascend flavor) or in the 32-lane xor-butterfly order (cuda flavor);
    ``normalized = w / denominator``, correctly rounded. Negative weights are allowed.

    Args:
        topk_weights: Contiguous fp32 ``[T, K]``, ``1 <= K <= 32``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``topk_weights``.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the summation order of the
            denominator.

    Returns:
        denominator: New fp32 ``[T]``.
        normalized: New fp32 ``[T, K]``.

    Raises:
        TypeError: ``topk_weights`` is not an fp32 tensor.
        ValueError: ``topk_weights`` is not 2-D or not contiguous, or has fewer than 1 or more
            than 32 columns.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return NORMALIZE_WEIGHT(topk_weights, target=target, flavor=flavor)


normalize_weight_parallel = parallel_entry(normalize_weight, "topk_weights")
