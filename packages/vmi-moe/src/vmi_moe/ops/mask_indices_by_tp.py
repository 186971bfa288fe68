"""``mask_indices_by_tp``: public dispatch (validation, allocation, backend choice).

Keeps the expert ids of one tensor-parallel rank and renumbers them to the rank's local experts;
every other id becomes ``-1`` (``docs/moe/mask_indices_by_tp.md``). Names and parameters follow
TileKernels; ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_int, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.plan import with_values
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MAX_TOPK, new_status
from ..kernels import mask_indices_by_tp as parallel
from ..kernels.common import STATUS_BAD_INDEX
from ..reference import indices as reference

ID_DTYPES = {"int64": torch.int64, "int32": torch.int32}
# The ``vmi`` command's ranks: 8 EP ranks, of which tensor-parallel pairs; this process is TP rank 1.
DEMO_EP_RANKS = 8
DEMO_TP_RANKS = 2
DEMO_TP_RANK = 1

SUPPORT = support("a SIMT region: integer division per id")


@dataclass
class MaskIndicesCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.MaskIndicesSpec
    indices: torch.Tensor
    masked: torch.Tensor
    status: torch.Tensor
    per_gpu: int
    num_tp_ranks: int
    tp_rank: int


def _raise_flags(words: list[int]) -> None:
    if words[STATUS_BAD_INDEX]:
        raise ValueError(f"mask_indices_by_tp: indices holds ids above 2^31 - 1 ({INT32_MAX}); mask_indices_by_tp "
                         f"takes 32-bit expert ids")


def _run(indices, n, num_ep_ranks, tp_rank, num_tp_ranks, *, out, target, flavor, launch):
    target = resolve_target(indices, target)
    # No bit of the result depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    check_tensor(indices, "indices", dtype=tuple(ID_DTYPES.values()), shape=(None, None), contiguous=True)
    num_tokens, num_topk = indices.shape
    if not 1 <= num_topk <= MAX_TOPK:
        raise ValueError(f"indices must have 1 to {MAX_TOPK} columns, got {num_topk}")
    n = check_int(n, "n", 1, INT32_MAX)
    num_ep_ranks = check_int(num_ep_ranks, "num_ep_ranks", 1)
    if num_ep_ranks > n:
        raise ValueError(f"num_ep_ranks ({num_ep_ranks}) must not exceed n ({n}): each EP rank needs at least "
                         f"one expert (per_gpu = n // num_ep_ranks >= 1)")
    num_tp_ranks = check_int(num_tp_ranks, "num_tp_ranks", 1, INT32_MAX)
    tp_rank = check_int(tp_rank, "tp_rank", 0)
    if tp_rank >= num_tp_ranks:
        raise ValueError(f"tp_rank ({tp_rank}) must be below num_tp_ranks ({num_tp_ranks})")
    masked = torch.empty_like(indices)
    if not launch:
        return masked
    if target == "torch":
        return masked.copy_(reference.mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks))
    if num_tokens == 0:
        return masked
    spec = parallel.MaskIndicesSpec(num_topk, indices.dtype == torch.int64)
    call = MaskIndicesCall(spec, indices, masked, new_status(indices.device), n // num_ep_ranks, num_tp_ranks,
                           tp_rank)
    parallel.launch(call, target)
    with_values(call.status, _raise_flags)
    return masked


def _inputs(shape, options, seed):
    """Expert ids drawn from ``[0, n)`` with repeats, about 2% of the slots unused (-1)."""
    num_tokens, n = shape
    g = generator(seed)
    indices = torch.randint(0, n, (num_tokens, options["num_topk"]), generator=g)
    indices[torch.rand(indices.shape, generator=g) < 0.02] = -1
    return {"indices": indices.to(ID_DTYPES[options["dtype"]]), "n": n, "num_ep_ranks": DEMO_EP_RANKS,
            "tp_rank": DEMO_TP_RANK, "num_tp_ranks": DEMO_TP_RANKS}


def _kernels(options, target, flavor):
    return [(parallel.build_mask_indices_by_tp,
             parallel.MaskIndicesSpec(options["num_topk"], options["dtype"] == "int64"))]


MASK_INDICES_BY_TP = KernelOp(
    "mask_indices_by_tp",
    (Param("indices", "Tensor"), Param("n", "int"), Param("num_ep_ranks", "int"), Param("tp_rank", "int"),
     Param("num_tp_ranks", "int")),
    ("masked",), _run,
    command=Command(
        summary="keep one TP rank's expert ids, renumbered to its local experts; -1 elsewhere",
        support=SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=((16384, 256), (4096, 384), (1, 256), (16, 256)),
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_topk", 8, (1, 2, 6, 8, 16, 32), "ids per token"),
                 Option("dtype", "int64", tuple(ID_DTYPES), "dtype of the ids")),
    ))


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int, *,
                       target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Keep the expert ids that belong to tensor-parallel rank ``tp_rank``, renumbered to its local experts.

    With ``per_gpu = n // num_ep_ranks`` and ``per_dp = num_tp_ranks * per_gpu``, each id ``v``
    becomes ``-1`` if ``v < 0`` or ``(v // per_gpu) % num_tp_ranks != tp_rank``; otherwise
    ``w = v - tp_rank * per_gpu`` and the result is ``w - (w // per_dp) * (per_dp - per_gpu)``
    (``-1`` if negative, which no accepted argument gives). Ids of ``n`` and above follow the same
    arithmetic. Exact for every accepted id and argument, the same on every target and flavor.

    Args:
        indices: Contiguous int64 or int32 ``[T, K]`` expert ids, ``1 <= K <= 32``; negative ids are
            unused slots. int64 ids must not exceed ``2^31 - 1`` (checked by the kernel).
        n: Experts over all EP ranks, ``1 <= n <= 2^31 - 1``.
        num_ep_ranks: Expert-parallel ranks, ``1 <= num_ep_ranks <= n``.
        tp_rank: This process's tensor-parallel rank, ``0 <= tp_rank < num_tp_ranks``.
        num_tp_ranks: Tensor-parallel ranks, ``1 <= num_tp_ranks <= 2^31 - 1``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``indices``.
        flavor: Bit conventions (see ``vmi_core.targets``); checked like every op's, but no bit of the
            result depends on it.

    Returns:
        New ``[T, K]`` tensor of ``indices``' dtype: the local expert ids, ``-1`` elsewhere.

    Raises:
        TypeError: ``indices`` is not an int64 or int32 tensor; ``n``, ``num_ep_ranks``, ``tp_rank`` or
            ``num_tp_ranks`` is not an int.
        ValueError: ``indices`` is not 2-D or not contiguous, or has fewer than 1 or more than 32
            columns; ``n``, ``num_ep_ranks``, ``tp_rank`` or ``num_tp_ranks`` is out of range.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran (the reference ``"torch"`` raises the same before writing):
            ``indices`` holds an id above ``2^31 - 1``.
    """
    return MASK_INDICES_BY_TP(indices, n, num_ep_ranks, tp_rank, num_tp_ranks, target=target, flavor=flavor)


mask_indices_by_tp_parallel = parallel_entry(mask_indices_by_tp, "indices")
