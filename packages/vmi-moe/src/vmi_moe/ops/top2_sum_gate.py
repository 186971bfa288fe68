"""``top2_sum_gate``: public dispatch of TileKernels v1's group-limited MoE gate (validation,
allocation, backend choice; ``docs/moe/top2_sum_gate.md``).

Names and parameters follow TileKernels v1; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vmi_core.checks import INT32_MAX, check_bool, check_disjoint, check_float, check_int, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.plan import with_values
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import compare_named, generator

from ..inputs import check_topk, new_status
from ..kernels import top2_sum_gate as parallel
from ..kernels.common import STATUS_BAD_COUNT, STATUS_BAD_INDEX, STATUS_NONFINITE
from ..reference import group_gate as reference
from .demo import SCALE, SHAPES, padding_mask
from .moe_topk_gate import _token_flags

OP = "top2_sum_gate"
SCORING_FUNCS = parallel.SCORING
# Each token ranks its groups against each other (G^2 compares), as topk_sum_and_topk_group_idx.
MAX_GROUPS = 256
# The replica choice ``(ep_rank mod c + (t mod c)(23333 mod c)) mod c`` stays in int32 for c <= this.
MAX_REPLICAS = 32768
# The ``vmi`` command's ranks: 8 EP ranks; this process is the last TP rank.
DEMO_EP_RANKS = 8
DEMO_REPLICAS = 3

SUPPORT = support("a SIMT region: per-lane scans, gathers and integer division by runtime divisors",
                  cpu="bit-exact against the reference in both flavors",
                  ascend_sim="bit-exact against the reference (ascend flavor)")

@dataclass
class Top2GateCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.Top2GateSpec
    logits: torch.Tensor
    bias: torch.Tensor
    mask: torch.Tensor | None
    fix_routing_mask: torch.Tensor | None
    to_physical_map: torch.Tensor | None
    logical_count: torch.Tensor | None
    unmapped: torch.Tensor | None
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    status: torch.Tensor
    ep_rank: int
    per_rank: int
    num_ep_ranks: int
    tp_rank: int
    num_tp_ranks: int
    routed_scaling_factor: float


def _check_groups(num_topk_groups, num_groups, num_experts: int, num_topk: int) -> tuple[int, int]:
    num_groups = check_int(num_groups, "num_groups", 0, MAX_GROUPS)
    num_topk_groups = check_int(num_topk_groups, "num_topk_groups", 0, num_groups)
    if (num_groups == 0) != (num_topk_groups == 0):
        raise ValueError(f"num_groups ({num_groups}) and num_topk_groups ({num_topk_groups}) must be both zero or "
                         f"both non-zero")
    if num_groups and num_experts % num_groups:
        raise ValueError(f"the {num_experts} experts must split evenly into num_groups ({num_groups}) groups")
    if num_groups == num_topk_groups:
        # Groups off: every group kept is no restriction.
        return 0, 0
    per_group = num_experts // num_groups
    if per_group < 2:
        raise ValueError(f"groups need at least 2 experts each for their top-2 sum, got {num_experts} experts in "
                         f"{num_groups} groups")
    if num_topk > num_topk_groups * per_group:
        raise ValueError(f"num_topk ({num_topk}) must not exceed the experts of the kept groups (num_topk_groups "
                         f"{num_topk_groups} x {per_group} experts per group)")
    return num_groups, num_topk_groups


def _prepare(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
             routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, mask,
             fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx, target, flavor):
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"{OP}: scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    target = resolve_target(logits, target)
    flavor = resolve_flavor(target, flavor)
    check_tensor(logits, "logits", dtype=torch.float32, shape=(None, None), contiguous=True)
    num_tokens, num_experts = logits.shape
    device = logits.device
    if num_experts == 0:
        raise ValueError("logits must have at least one expert column")
    check_tensor(bias, "bias", dtype=torch.float32, shape=(num_experts,), device=device, contiguous=True)
    num_topk = check_topk(num_topk, num_experts)
    num_groups, num_topk_groups = _check_groups(num_topk_groups, num_groups, num_experts, num_topk)
    use_shared_as_routed = check_bool(use_shared_as_routed, "use_shared_as_routed")
    num_shared = check_int(num_shared_experts, "num_shared_experts", 0)
    if not use_shared_as_routed:
        num_shared = 0
    elif num_shared not in (1, 2):
        raise ValueError(f"num_shared_experts must be 1 or 2 with use_shared_as_routed, got {num_shared}")
    elif num_topk % num_shared or num_experts % (num_topk // num_shared):
        raise ValueError(f"with use_shared_as_routed, num_topk ({num_topk}) must be a multiple of num_shared_experts "
                         f"({num_shared}) and the {num_experts} experts a multiple of their quotient")
    scale = check_float(routed_scaling_factor, "routed_scaling_factor")
    num_logical = num_experts + num_shared

    mask = _token_flags(mask, "mask", num_tokens, device)
    fix_routing_mask = _token_flags(fix_routing_mask, "fix_routing_mask", num_tokens, device)
    if (to_physical_map is None) != (logical_count is None):
        raise ValueError("to_physical_map and logical_count must be given together")
    num_replicas = 1
    if to_physical_map is not None:
        check_tensor(to_physical_map, "to_physical_map", dtype=torch.int32, shape=(num_logical, None),
                     device=device, contiguous=True)
        num_replicas = to_physical_map.shape[1]
        if not 1 <= num_replicas <= MAX_REPLICAS:
            raise ValueError(f"to_physical_map must have 1 to {MAX_REPLICAS} replica columns, got {num_replicas}")
        check_tensor(logical_count, "logical_count", dtype=torch.int32, shape=(num_logical,), device=device,
                     contiguous=True)
    if num_shared > num_replicas - 1:
        raise ValueError(f"num_shared_experts ({num_shared}) must not exceed the extra replica columns of "
                         f"to_physical_map (its size(1) - 1 = {num_replicas - 1}; without a map 0)")
    # EP/TP ranks: E + Dup - 1 physical experts split over the EP ranks.
    num_physical = num_experts + num_replicas - 1
    num_ep_ranks = check_int(num_ep_ranks, "num_ep_ranks", 1, num_physical)
    ep_rank = check_int(ep_rank, "ep_rank", 0, num_ep_ranks - 1)
    num_tp_ranks = check_int(num_tp_ranks, "num_tp_ranks", 1, INT32_MAX)
    tp_rank = check_int(tp_rank, "tp_rank", 0, num_tp_ranks - 1)
    if unmapped_topk_idx is not None:
        check_tensor(unmapped_topk_idx, "unmapped_topk_idx", dtype=torch.int64, shape=(num_tokens, num_topk),
                     device=device, contiguous=False)
        if unmapped_topk_idx.stride(1) != 1 or (num_tokens > 1 and unmapped_topk_idx.stride(0) < num_topk):
            raise ValueError(f"unmapped_topk_idx must have unit column stride and non-overlapping rows, got "
                             f"strides {tuple(unmapped_topk_idx.stride())}")
        # The kernel takes its row stride as an int32.
        check_int(unmapped_topk_idx.stride(0), "the row stride of unmapped_topk_idx", high=INT32_MAX)
    if fix_routing_mask is not None and unmapped_topk_idx is None:
        raise ValueError("fix_routing_mask requires unmapped_topk_idx (the fixed experts)")
    check_disjoint({"unmapped_topk_idx": unmapped_topk_idx},
                   {"logits": logits, "bias": bias, "mask": mask, "fix_routing_mask": fix_routing_mask,
                    "to_physical_map": to_physical_map, "logical_count": logical_count})

    topk_idx = torch.empty(num_tokens, num_topk + num_shared, dtype=torch.int64, device=device)
    topk_weights = torch.empty(num_tokens, num_topk + num_shared, dtype=torch.float32, device=device)
    spec = parallel.Top2GateSpec(
        num_experts, num_topk, num_groups, num_topk_groups, num_shared, num_replicas, scoring_func, flavor.name,
        has_mask=mask is not None, has_fixed=fix_routing_mask is not None,
        has_unmapped=unmapped_topk_idx is not None, has_map=to_physical_map is not None)
    call = Top2GateCall(spec, logits, bias, mask, fix_routing_mask, to_physical_map, logical_count,
                        unmapped_topk_idx, topk_idx, topk_weights, new_status(device), ep_rank,
                        num_physical // num_ep_ranks, num_ep_ranks, tp_rank, num_tp_ranks, scale)
    return target, call


def _run_reference(call: Top2GateCall) -> None:
    spec = call.spec
    idx, weights, unmapped = reference.top2_sum_gate(
        call.logits, call.bias, spec.num_topk, spec.num_topk_groups, spec.num_groups, spec.num_shared > 0,
        spec.num_shared, call.routed_scaling_factor, call.ep_rank, call.num_ep_ranks, call.tp_rank,
        call.num_tp_ranks, spec.scoring, call.mask, call.fix_routing_mask, call.to_physical_map, call.logical_count,
        call.unmapped, flavor=spec.flavor)
    call.topk_idx.copy_(idx)
    call.topk_weights.copy_(weights)
    if call.unmapped is not None:
        call.unmapped.copy_(unmapped)


def _raise_flags(words: list[int]) -> None:
    # The reference's messages, one per flag raised.
    flags = ((STATUS_NONFINITE, reference.NONFINITE_MESSAGE), (STATUS_BAD_INDEX, reference.FIXED_MESSAGE),
             (STATUS_BAD_COUNT, reference.MAP_MESSAGE))
    errors = [message for word, message in flags if words[word]]
    if errors:
        raise ValueError(f"{OP}: " + "; ".join(errors))


def _run(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
         routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, mask, fix_routing_mask,
         to_physical_map, logical_count, unmapped_topk_idx, *, out, target, flavor, launch):
    target, call = _prepare(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                            num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                            scoring_func, mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
                            target, flavor)
    if launch and target == "torch":
        _run_reference(call)
    elif launch and call.logits.shape[0]:
        # The kernel flags bad data while it writes: unmapped_topk_idx (read too: the fixed experts)
        # gets its results from a scratch copy only once the flags are clear, so an error leaves it as
        # it was.
        staged = call if call.unmapped is None else replace(call, unmapped=call.unmapped.clone())
        parallel.launch(staged, target)
        with_values(staged.status, _raise_flags)
        if call.unmapped is not None:
            call.unmapped.copy_(staged.unmapped)
    return call.topk_idx, call.topk_weights


# --- the ``vmi`` command ---------------------------------------------------------------------------


def demo_map(num_logical: int, num_replicas: int, num_physical: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(to_physical_map int32 [L, Dup], logical_count int32 [L])``: replica 0 of logical expert ``l`` is
    physical ``l``, replicas 1 .. count - 1 drawn from ``[0, num_physical)``, unused cells -1."""
    g = generator(seed)
    count = torch.randint(1, num_replicas + 1, (num_logical,), generator=g, dtype=torch.int32)
    table = torch.randint(0, num_physical, (num_logical, num_replicas), generator=g, dtype=torch.int32)
    table[:, 0] = torch.arange(num_logical, dtype=torch.int32)
    table[torch.arange(num_replicas)[None, :] >= count[:, None]] = -1
    return table.contiguous(), count


def _inputs(shape, options, seed):
    num_tokens, num_experts = shape
    g = generator(seed)
    num_shared = options["num_shared_experts"]
    inputs = {"logits": torch.randn(shape, generator=g), "bias": torch.randn(num_experts, generator=g),
              "mask": padding_mask(num_tokens) if options["mask"] else None,
              # Always passed, so the command compares it too: the fixed experts, or an output only.
              "unmapped_topk_idx": torch.rand(num_tokens, num_experts, generator=g).argsort(dim=1)[
                  :, :options["num_topk"]].contiguous()}
    if options["fixed"]:
        inputs["fix_routing_mask"] = torch.rand(num_tokens, generator=g) < 0.5
    if options["mapping"] or num_shared:
        inputs["to_physical_map"], inputs["logical_count"] = demo_map(
            num_experts + num_shared, DEMO_REPLICAS, num_experts + DEMO_REPLICAS - 1, seed + 1)
    return inputs


def _arguments(inputs, options, flavor):
    num_tp_ranks = options["num_tp_ranks"]
    return {"use_shared_as_routed": options["num_shared_experts"] > 0, "routed_scaling_factor": SCALE,
            "ep_rank": DEMO_EP_RANKS - 1, "num_ep_ranks": DEMO_EP_RANKS, "tp_rank": num_tp_ranks - 1}


def _kernels(options, target, flavor):
    """The gate kernel as the dispatch specialises it (``_prepare``) for a call with these options."""
    inputs = _inputs((1, 256), options, 0)
    values = {**options, **inputs, **_arguments(inputs, options, flavor)}
    meta = {name: t.to("meta") if isinstance(t, torch.Tensor) else t for name, t in values.items()}
    _, call = _prepare(meta["logits"], meta["bias"], options["num_topk"], options["num_topk_groups"],
                       options["num_groups"], meta["use_shared_as_routed"], options["num_shared_experts"],
                       SCALE, meta["ep_rank"], DEMO_EP_RANKS, meta["tp_rank"], options["num_tp_ranks"],
                       options["scoring_func"], meta["mask"], meta.get("fix_routing_mask"),
                       meta.get("to_physical_map"), meta.get("logical_count"), meta["unmapped_topk_idx"], target,
                       flavor)
    return [(parallel.build_top2_sum_gate, call.spec)]


def _optional(name: str, mutable: bool = False) -> Param:
    return Param(name, "Tensor", None, optional=True, mutable=mutable)


TOP2_SUM_GATE = KernelOp(
    OP,
    (Param("logits", "Tensor"), Param("bias", "Tensor"), Param("num_topk", "int"), Param("num_topk_groups", "int"),
     Param("num_groups", "int"), Param("use_shared_as_routed", "bool"), Param("num_shared_experts", "int"),
     Param("routed_scaling_factor", "float"), Param("ep_rank", "int"), Param("num_ep_ranks", "int"),
     Param("tp_rank", "int"), Param("num_tp_ranks", "int"), Param("scoring_func", "str"), _optional("mask"),
     _optional("fix_routing_mask"), _optional("to_physical_map"), _optional("logical_count"),
     _optional("unmapped_topk_idx", mutable=True)),
    ("topk_idx", "topk_weights"), _run,
    command=Command(
        summary="v1 group-limited MoE gate: sigmoid/sqrt-softplus/softmax scores, top-2-sum group ranking, "
                "normalised scaled weights, shared experts, replicas, EP/TP masking",
        support=SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=SHAPES,
        make_inputs=_inputs,
        kernels=_kernels,
        options=(
            Option("scoring_func", "sqrtsoftplus", SCORING_FUNCS, "score of a logit"),
            Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "routed experts per token"),
            Option("num_groups", 8, (0, 4, 8, 16), "expert groups (0: no groups; equal to num_topk_groups: off)"),
            Option("num_topk_groups", 4, (0, 1, 2, 4, 8), "groups kept per token"),
            Option("num_shared_experts", 0, (0, 1, 2), "shared experts appended as routed slots (with a map)"),
            Option("mask", True, help="pad the last 1% of the tokens"),
            Option("fixed", False, help="fixed routing for about half of the tokens"),
            Option("mapping", False, help="a 3-replica physical map (always with shared experts)"),
            Option("num_tp_ranks", 1, (1, 2, 4), "TP ranks of the 8 EP ranks (this process: the last)"),
        ),
        arguments=_arguments,
        check=compare_named(("topk_idx", "topk_weights", "unmapped_topk_idx")),
    ))


def top2_sum_gate(logits: torch.Tensor, bias: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int,
                  use_shared_as_routed: bool, num_shared_experts: int, routed_scaling_factor: float, ep_rank: int,
                  num_ep_ranks: int, tp_rank: int, num_tp_ranks: int, scoring_func: str,
                  mask: torch.Tensor | None = None, fix_routing_mask: torch.Tensor | None = None,
                  to_physical_map: torch.Tensor | None = None, logical_count: torch.Tensor | None = None,
                  unmapped_topk_idx: torch.Tensor | None = None, *, target: str | None = None,
                  flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to ``num_topk`` experts, limited to its best groups of experts (TileKernels v1's gate).

    Scores ``u`` of the logits (``scoring_func``): ``sigmoid`` ``fl(1 / fl(1 + exp(-x)))``;
    ``sqrtsoftplus`` the flavor's ``sqrt(softplus(x))`` (as ``moe_topk_gate_forward``); ``softmax``
    ``fl(exp(fl(x - max)) / s)`` with ``s`` the numerators summed from expert 0 up. Ranking keys
    ``u + bias`` (softmax: ``x + bias``). With groups (``num_groups != num_topk_groups``), each group
    of ``E / num_groups`` experts scores the sum of its two largest keys; only the experts of the
    ``num_topk_groups`` best groups (descending score, equal scores by ascending group) compete. The
    ``num_topk`` experts of largest key are taken in rank order (descending, equal keys by ascending
    expert), or, for tokens flagged in ``fix_routing_mask``, the experts in ``unmapped_topk_idx``.

    Weights: ``fl(fl(u / D) * routed_scaling_factor)`` with ``D = ((1e-20 + u_0) + u_1) + ...`` over
    the slots in order; ``exp`` is correctly rounded and every division too, so the bits are the
    same on every target. With ``use_shared_as_routed``, ``num_shared_experts`` (1 or 2) slots
    follow with logical ids ``E, E+1`` and weight 1.0. With ``to_physical_map [E + S, Dup]`` each
    logical id becomes replica ``(ep_rank + token * 23333) mod logical_count`` of its row. Last, each
    id of another TP rank becomes -1 and the others are renumbered to the rank's local experts
    (``mask_indices_by_tp`` with ``per_rank = (E + Dup - 1) // num_ep_ranks``). ``mask`` False tokens
    get ids -1 and weights +0.0, and -1 in ``unmapped_topk_idx``.

    Args:
        logits: Contiguous fp32 ``[T, E]``, ``E >= 1``.
        bias: Contiguous fp32 ``[E]`` added to the keys for ranking only.
        num_topk: Routed experts per token, ``1 <= num_topk <= min(E, 32)``, and with groups at most
            ``num_topk_groups * E / num_groups``.
        num_topk_groups: Groups kept per token, ``0 <= num_topk_groups <= num_groups``; 0 exactly when
            ``num_groups`` is.
        num_groups: Expert groups, ``0 <= num_groups <= 256``, dividing ``E``; groups are on when it
            differs from ``num_topk_groups``, and then hold at least 2 experts each.
        use_shared_as_routed: Append ``num_shared_experts`` shared-expert slots to every token.
        num_shared_experts: ``S``, 1 or 2 with ``use_shared_as_routed`` (``num_topk`` a multiple of
            ``S``, ``E`` a multiple of ``num_topk / S``, ``S <= Dup - 1``: a map needed); an int >= 0,
            ignored, without.
        routed_scaling_factor: Multiplier of the routed weights (any real number).
        ep_rank: This process's expert-parallel rank, ``0 <= ep_rank < num_ep_ranks``; enters the
            replica choice.
        num_ep_ranks: Expert-parallel ranks, ``1 <= num_ep_ranks <= E + Dup - 1`` (``Dup = 1`` without
            a map).
        tp_rank: This process's tensor-parallel rank, ``0 <= tp_rank < num_tp_ranks``.
        num_tp_ranks: Tensor-parallel ranks, ``1 <= num_tp_ranks <= 2^31 - 1``.
        scoring_func: ``"sigmoid"``, ``"sqrtsoftplus"`` or ``"softmax"``.
        mask: Optional bool, one element per token (contiguous): False pads the token.
        fix_routing_mask: Optional bool per token (contiguous): True takes the experts in
            ``unmapped_topk_idx`` (needs it; duplicates kept).
        to_physical_map: Optional contiguous int32 ``[E + S, Dup]``, ``1 <= Dup <= 32768``, of physical
            ids per logical expert; given together with ``logical_count``.
        logical_count: Optional contiguous int32 ``[E + S]``: replicas per logical expert, each in
            ``[1, Dup]``.
        unmapped_topk_idx: Optional int64 ``[T, num_topk]`` (unit column stride, non-overlapping rows,
            row stride < 2^31): read as the fixed experts of ``fix_routing_mask`` tokens, then written
            with the logical routed experts.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``logits``.
        flavor: Bit conventions (see ``vmi_core.targets``): the formula of ``sqrtsoftplus``; no other bit
            depends on it.

    Returns:
        topk_idx: New int64 ``[T, num_topk + S]``: the EP/TP-masked physical ids (logical without a map),
            -1 for other TP ranks and padded tokens.
        topk_weights: New fp32 ``[T, num_topk + S]``.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype (``logits``, ``bias`` fp32; the
            masks bool; ``to_physical_map``, ``logical_count`` int32; ``unmapped_topk_idx`` int64); an int
            argument is not an int, ``use_shared_as_routed`` not a bool, ``routed_scaling_factor`` not a
            real number, ``scoring_func`` not a str.
        ValueError: Before any kernel: ``scoring_func`` is not one of the three; a tensor has the wrong
            shape, element count, stride or device; a size or rank is out of range; ``num_groups`` and
            ``num_topk_groups`` break the rules above; ``num_topk`` exceeds the kept groups' experts; the
            shared-expert rules are broken; ``to_physical_map``/``logical_count`` given without the
            other, ``fix_routing_mask`` without ``unmapped_topk_idx``; ``unmapped_topk_idx`` overlaps an
            input.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran (the reference ``"torch"`` raises the same before writing): a
            non-finite logit of a routed token or ranking key of a normally routed one, a fixed expert
            outside ``[0, E)``, a replica count outside ``[1, Dup]`` or a negative physical id at a chosen
            replica; ``unmapped_topk_idx`` is then left as it was.
    """
    return TOP2_SUM_GATE(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                         num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                         scoring_func, mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx,
                         target=target, flavor=flavor)


top2_sum_gate_parallel = parallel_entry(top2_sum_gate, "logits")
