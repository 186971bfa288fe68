"""``aux_fi``: public dispatch (validation, allocation, backend choice).

The frequency term of the load-balancing auxiliary loss, ``fi[e] = count[e] * E / (T * num_aux_topk)``
in one fixed rounding order (``docs/moe/aux_fi.md``). Names and parameters follow TileKernels;
``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_int
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target

from ..inputs import check_ids, new_status, raise_status
from ..kernels import group_count as parallel
from ..kernels.get_fused_mapping import build_fused_mapping_count
from ..reference import counts as reference
from .demo import SIMT_SUPPORT, SOURCE_EXPERTS, routing
from .get_fused_mapping import MAX_EXPERTS
from .group_count import TOPK_CHOICES


@dataclass
class AuxFiCall:
    """A validated call: the tensors the kernels read and write, and the divisor's top-k."""

    topk_idx: torch.Tensor
    num_aux_topk: int
    fi: torch.Tensor
    status: torch.Tensor


def _run(topk_idx, num_experts, num_aux_topk, *, out, target, flavor, launch):
    target = resolve_target(topk_idx, target)
    # No bit of fi depends on the flavor; the argument is still checked like every op's.
    resolve_flavor(target, flavor)
    check_ids(topk_idx, "topk_idx")
    num_experts = check_int(num_experts, "num_experts", 1, MAX_EXPERTS)
    # An int32 kernel argument; T * num_aux_topk < 2^30 * 2^31 and count * E < 2^30 * 2^16 fit int64.
    num_aux_topk = check_int(num_aux_topk, "num_aux_topk", 1, INT32_MAX)
    fi = torch.empty(num_experts, dtype=torch.float32, device=topk_idx.device)
    if not launch:
        return fi
    if target == "torch":
        return fi.copy_(reference.aux_fi(topk_idx, num_experts, num_aux_topk))
    call = AuxFiCall(topk_idx, num_aux_topk, fi, new_status(topk_idx.device))
    parallel.launch_aux_fi(call, target)
    raise_status(call.status, "aux_fi", "", "topk_idx")
    return fi


def _inputs(shape, options, seed):
    return {"topk_idx": routing(shape, options, seed), "num_experts": shape[1],
            "num_aux_topk": options["num_aux_topk"] or options["num_topk"]}


def _kernels(options, target, flavor):
    return [(build_fused_mapping_count, parallel.count_spec(SOURCE_EXPERTS, options["num_topk"])),
            (parallel.build_count_sum, parallel.CountSumSpec(SOURCE_EXPERTS, parallel.FREQUENCIES))]


AUX_FI = KernelOp(
    "aux_fi",
    (Param("topk_idx", "Tensor"), Param("num_experts", "int"), Param("num_aux_topk", "int")),
    ("fi",),
    _run,
    command=Command(
        summary="per-expert frequency term of the load-balancing loss, count * E / (T * num_aux_topk)",
        support=SIMT_SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=((16384, 256), (4096, 384), (1024, 72), (1, 256), (16, 256)),
        make_inputs=_inputs,
        kernels=_kernels,
        options=(Option("num_topk", 8, TOPK_CHOICES, "experts per token"),
                 Option("num_aux_topk", 0, (), "the divisor's top-k (0: num_topk)")),
    ))


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int, *, target: str | None = None,
           flavor: str | None = None) -> torch.Tensor:
    """The per-expert frequency ``fi[e] = count[e] * E / (T * num_aux_topk)`` of the routing ``topk_idx``.

    ``count[e]`` is the number of entries equal to ``e`` (``-1`` counts nowhere). Rounding, the same
    bits on every target: the integer products ``count[e] * E`` and ``T * num_aux_topk`` exact, each
    converted to fp32 once (round to nearest even), then one IEEE fp32 division. An expert with no
    entry gets +0; an empty batch (``T = 0``) gives zeros (not NaN).

    Args:
        topk_idx: Contiguous int64 ``[T, K]`` expert ids in ``[-1, num_experts)``, ``1 <= K <= 32``, at
            most ``2^30 - 1`` entries; ``-1`` marks an unused slot.
        num_experts: ``E``, ``1 <= E <= 65536``.
        num_aux_topk: The experts per token the loss normalises by, ``1 <= num_aux_topk <= 2^31 - 1``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``topk_idx``.
        flavor: Bit conventions (see ``vmi_core.targets``); checked like every op's, but no bit of
            ``fi`` depends on it.

    Returns:
        fi: New fp32 ``[E]``.

    Raises:
        TypeError: ``topk_idx`` is not an int64 tensor; ``num_experts`` or ``num_aux_topk`` is not an
            int.
        ValueError: ``topk_idx`` is not 2-D or not contiguous, has fewer than 1 or more than 32 columns
            or too many entries; ``num_experts`` or ``num_aux_topk`` is out of range.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran: ``topk_idx`` holds an id outside ``[-1, E)``.
    """
    return AUX_FI(topk_idx, num_experts, num_aux_topk, target=target, flavor=flavor)


aux_fi_parallel = parallel_entry(aux_fi, "topk_idx")
