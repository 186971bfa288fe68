"""``moe_topk_gate_forward`` (alias ``moe_topk_gate``): public dispatch.

Validation, allocation and backend choice of the sqrt-softplus top-k gate. Names
and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions
(see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vmi_core.checks import INT32_MAX, check_bool, check_disjoint, check_float, check_int, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import compare_named, generator

from ..inputs import check_scoring_func, check_topk, new_status, raise_status
from ..kernels import moe_topk_gate as parallel
from ..reference import gate as reference
from .demo import SCALE, SHAPES, SOURCE_EXPERTS, SUPPORT, padding_mask

# ep_rank enters the replica choice and the random draws as an int32.
MAX_EP_RANK = 2**31 - 1


@dataclass
class GateCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.GateSpec
    logits: torch.Tensor
    mask: torch.Tensor | None
    bias: torch.Tensor | None
    image_bias: torch.Tensor | None
    image_token_mask: torch.Tensor | None
    fix_routing_mask: torch.Tensor | None
    to_physical_map: torch.Tensor | None
    logical_count: torch.Tensor | None
    unmapped: torch.Tensor | None
    force_random: torch.Tensor | None
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    scores: torch.Tensor | None
    status: torch.Tensor
    ep_rank: int
    routed_scaling_factor: float
    # Fields holding the caller's tensors that the kernel writes.
    caller_outputs: tuple[str, ...] = ()


def _token_flags(t, name: str, num_tokens: int, device) -> torch.Tensor | None:
    """A per-token bool tensor (any shape with ``num_tokens`` elements), flattened."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.bool:
        raise TypeError(f"{name} must be torch.bool, got {t.dtype}")
    if t.numel() != num_tokens:
        raise ValueError(f"{name} must have one element per token ({num_tokens}), got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    return t.reshape(-1)


def _prepare(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank,
             scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map,
             logical_count, unmapped_topk_idx, force_random, out, scores, target, flavor):
    check_scoring_func("moe_topk_gate_forward", scoring_func)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    target = resolve_target(logits, target)
    flavor = resolve_flavor(target, flavor)
    check_tensor(logits, "logits", dtype=torch.float32, shape=(None, None), contiguous=True)
    num_tokens, num_experts = logits.shape
    device = logits.device
    if num_experts == 0:
        raise ValueError("logits must have at least one expert column")
    num_topk = check_topk(num_topk, num_experts)
    use_shared_as_routed = check_bool(use_shared_as_routed, "use_shared_as_routed")
    num_shared = check_int(num_shared_experts, "num_shared_experts", 0)
    if not use_shared_as_routed:
        num_shared = 0
    elif num_shared not in (1, 2):
        raise ValueError(f"num_shared_experts must be 1 or 2 with use_shared_as_routed, got {num_shared}")
    scale = check_float(routed_scaling_factor, "routed_scaling_factor")
    ep_rank = check_int(ep_rank, "ep_rank", 0, MAX_EP_RANK)
    num_physical_topk, num_logical = num_topk + num_shared, num_experts + num_shared

    if bias is not None:
        check_tensor(bias, "bias", dtype=torch.float32, shape=(num_experts,), device=device, contiguous=True)
    if (image_bias is None) != (image_token_mask is None):
        raise ValueError("image_bias and image_token_mask must be given together")
    if image_bias is not None:
        check_tensor(image_bias, "image_bias", dtype=torch.float32, shape=(num_experts,),
                     device=device, contiguous=True)
    mask = _token_flags(mask, "mask", num_tokens, device)
    image_token_mask = _token_flags(image_token_mask, "image_token_mask", num_tokens, device)
    fix_routing_mask = _token_flags(fix_routing_mask, "fix_routing_mask", num_tokens, device)
    force_random = _token_flags(force_random, "force_random", num_tokens, device)
    if (to_physical_map is None) != (logical_count is None):
        raise ValueError("to_physical_map and logical_count must be given together")
    num_replicas = 1
    if to_physical_map is not None:
        check_tensor(to_physical_map, "to_physical_map", dtype=torch.int32, shape=(num_logical, None),
                     device=device, contiguous=True)
        num_replicas = to_physical_map.shape[1]
        if num_replicas == 0:
            raise ValueError("to_physical_map must have at least one replica column")
        check_tensor(logical_count, "logical_count", dtype=torch.int32, shape=(num_logical,),
                     device=device, contiguous=True)
    if unmapped_topk_idx is not None:
        check_tensor(unmapped_topk_idx, "unmapped_topk_idx", dtype=torch.int64, shape=(num_tokens, num_topk),
                     device=device, contiguous=False)
        if unmapped_topk_idx.stride(1) != 1 or (num_tokens > 1 and unmapped_topk_idx.stride(0) < num_topk):
            raise ValueError(f"unmapped_topk_idx must have unit column stride and non-overlapping rows, got "
                             f"strides {tuple(unmapped_topk_idx.stride())}")
        # The kernel takes its row stride as an int32 (rows are launched in int32-addressable chunks).
        check_int(unmapped_topk_idx.stride(0), "the row stride of unmapped_topk_idx", high=INT32_MAX)
    if fix_routing_mask is not None and unmapped_topk_idx is None:
        raise ValueError("fix_routing_mask requires unmapped_topk_idx (the fixed experts)")
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError("out must be a (topk_idx, topk_weights) tuple")
        check_tensor(out[0], "out[0] (topk_idx)", dtype=torch.int64, shape=(num_tokens, num_physical_topk),
                     device=device, contiguous=True)
        check_tensor(out[1], "out[1] (topk_weights)", dtype=torch.float32, shape=(num_tokens, num_physical_topk),
                     device=device, contiguous=True)
        topk_idx, topk_weights = out
    else:
        topk_idx = torch.empty(num_tokens, num_physical_topk, dtype=torch.int64, device=device)
        topk_weights = torch.empty(num_tokens, num_physical_topk, dtype=torch.float32, device=device)
    if scores is not None:
        check_tensor(scores, "scores", dtype=torch.float32, shape=(num_tokens, num_experts),
                     device=device, contiguous=True)
    check_disjoint(
        {"out[0] (topk_idx)": topk_idx if out is not None else None,
         "out[1] (topk_weights)": topk_weights if out is not None else None,
         "scores": scores, "unmapped_topk_idx": unmapped_topk_idx},
        {"logits": logits, "mask": mask, "bias": bias, "image_bias": image_bias, "image_token_mask": image_token_mask,
         "fix_routing_mask": fix_routing_mask, "to_physical_map": to_physical_map, "logical_count": logical_count,
         "force_random": force_random})

    spec = parallel.GateSpec(
        num_experts, num_topk, num_shared, num_replicas, flavor.name, has_mask=mask is not None,
        has_bias=bias is not None, has_image=image_bias is not None, has_fixed=fix_routing_mask is not None,
        has_unmapped=unmapped_topk_idx is not None, has_map=to_physical_map is not None,
        has_force_random=force_random is not None, has_scores=scores is not None)
    caller_outputs = (("topk_idx", "topk_weights") if out is not None else ()) + (
        ("scores",) if scores is not None else ()) + (("unmapped",) if unmapped_topk_idx is not None else ())
    call = GateCall(spec, logits, mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map,
                    logical_count, unmapped_topk_idx, force_random, topk_idx, topk_weights, scores,
                    new_status(device), ep_rank, scale, caller_outputs)
    return target, call


def _run_reference(call: GateCall) -> None:
    spec = call.spec
    idx, weights, unmapped, scores = reference.moe_topk_gate_forward(
        call.logits, spec.num_topk, spec.num_shared > 0, spec.num_shared, call.routed_scaling_factor, call.ep_rank,
        mask=call.mask, bias=call.bias, image_bias=call.image_bias, image_token_mask=call.image_token_mask,
        fix_routing_mask=call.fix_routing_mask, to_physical_map=call.to_physical_map,
        logical_count=call.logical_count, unmapped_topk_idx=call.unmapped, force_random=call.force_random,
        flavor=spec.flavor)
    call.topk_idx.copy_(idx)
    call.topk_weights.copy_(weights)
    if call.unmapped is not None:
        call.unmapped.copy_(unmapped)
    if call.scores is not None:
        call.scores.copy_(scores)


def _staged(call: GateCall) -> GateCall:
    """The call with the caller's tensors that the kernel writes replaced by scratch copies.

    The kernel flags bad data (non-finite logits, bad fixed experts) while it writes; the
    caller's ``out``, ``scores`` and ``unmapped_topk_idx`` get the results only once the
    flags are clear, so an error leaves them as they were. ``unmapped_topk_idx`` is also
    read (the fixed experts), so its scratch copy starts as a clone.
    """
    return replace(call, **{name: getattr(call, name).clone() for name in call.caller_outputs})


def _run(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func,
         mask, bias, image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count,
         unmapped_topk_idx, force_random, scores, *, out, target, flavor, launch):
    target, call = _prepare(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor,
                            ep_rank, scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask,
                            to_physical_map, logical_count, unmapped_topk_idx, force_random, out, scores, target,
                            flavor)
    if launch and target == "torch":
        _run_reference(call)
    elif launch and call.logits.shape[0]:
        staged = _staged(call)
        parallel.launch(staged, target)
        raise_status(staged.status, "moe_topk_gate_forward", "logits", "unmapped_topk_idx")
        for name in call.caller_outputs:
            getattr(call, name).copy_(getattr(staged, name))
    return call.topk_idx, call.topk_weights


def _inputs(shape, options, seed):
    # Near-ties at the top-k boundary need no re-draw: the kernel's scores and keys are the
    # reference's bits, and both rank equal keys by the lower expert.
    num_tokens, num_experts = shape
    g = generator(seed)
    logits = torch.randn(shape, generator=g)
    bias = torch.randn(num_experts, generator=g) if options["bias"] else None
    mask = padding_mask(num_tokens) if options["mask"] else None
    return {"logits": logits, "bias": bias, "mask": mask}


def _arguments(inputs, options, flavor):
    return {"use_shared_as_routed": options["num_shared_experts"] > 0, "routed_scaling_factor": SCALE,
            "ep_rank": 0, "scores": torch.empty_like(inputs["logits"])}


# The results and the scores, bit for bit: the kernel's scores are the torch twin's (correctly
# rounded exp/log1p from fp32 arithmetic on every target), so selection and weights are too.
_check = compare_named(("topk_idx", "topk_weights", "scores"))


def _kernels(options, target, flavor):
    """The gate kernel as the dispatch specialises it (``_prepare``) for a call with these options."""
    logits = torch.empty(1, SOURCE_EXPERTS, device="meta")
    inputs = {"logits": logits,
              "bias": torch.empty(SOURCE_EXPERTS, device="meta") if options["bias"] else None,
              "mask": torch.empty(1, dtype=torch.bool, device="meta") if options["mask"] else None}
    values = {**inputs, **_arguments(inputs, options, flavor)}
    _, call = _prepare(logits, options["num_topk"], values["use_shared_as_routed"], options["num_shared_experts"],
                       values["routed_scaling_factor"], values["ep_rank"], "sqrtsoftplus", values["mask"],
                       values["bias"], None, None, None, None, None, None, None, None, values["scores"], target,
                       flavor)
    return [(parallel.build_moe_topk_gate, call.spec)]


def _optional(name: str, mutable: bool = False) -> Param:
    return Param(name, "Tensor", None, optional=True, mutable=mutable)


MOE_TOPK_GATE_FORWARD = KernelOp(
    "moe_topk_gate_forward",
    (Param("logits", "Tensor"), Param("num_topk", "int"), Param("use_shared_as_routed", "bool"),
     Param("num_shared_experts", "int"), Param("routed_scaling_factor", "float"), Param("ep_rank", "int"),
     Param("scoring_func", "str", "sqrtsoftplus"), _optional("mask"), _optional("bias"), _optional("image_bias"),
     _optional("image_token_mask"), _optional("fix_routing_mask"), _optional("to_physical_map"),
     _optional("logical_count"), _optional("unmapped_topk_idx", mutable=True), _optional("force_random"),
     _optional("scores", mutable=True)),
    ("topk_idx", "topk_weights"), _run, outs=("out_topk_idx", "out_topk_weights"),
    command=Command(
        summary="sqrt-softplus MoE top-k gate: biased selection, normalised scaled weights, shared experts",
        support=SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=SHAPES,
        make_inputs=_inputs,
        kernels=_kernels,
        options=(
            Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "routed experts per token"),
            Option("num_shared_experts", 0, (0, 1, 2), "shared experts appended as routed slots"),
            Option("bias", True, help="selection bias"),
            Option("mask", True, help="pad the last 1% of the tokens"),
        ),
        arguments=_arguments,
        check=_check,
        name="moe_topk_gate",
    ))


def moe_topk_gate_forward(logits: torch.Tensor, num_topk: int, use_shared_as_routed: bool, num_shared_experts: int,
                          routed_scaling_factor: float, ep_rank: int, scoring_func: str = "sqrtsoftplus",
                          mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                          image_bias: torch.Tensor | None = None, image_token_mask: torch.Tensor | None = None,
                          fix_routing_mask: torch.Tensor | None = None, to_physical_map: torch.Tensor | None = None,
                          logical_count: torch.Tensor | None = None, unmapped_topk_idx: torch.Tensor | None = None,
                          force_random: torch.Tensor | None = None,
                          out: tuple[torch.Tensor, torch.Tensor] | None = None, scores: torch.Tensor | None = None,
                          *, target: str | None = None,
                          flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to ``num_topk`` experts (plus shared ones) with the sqrt-softplus gate.

    Scores ``u = sqrt(softplus(logits))``; experts
    are ranked by ``u + bias`` (``image_bias`` for tokens flagged in ``image_token_mask``),
    descending, equal keys by ascending expert; the bias does not enter the weights
    ``fl(fl(u / D) * routed_scaling_factor)`` with ``D = sum(u_sel) + 1e-20`` (flavor's
    order). With ``use_shared_as_routed``, ``num_shared_experts`` (1 or 2) slots follow
    with logical ids ``E, E+1`` and weight 1.0, so ``P = num_topk + S``.

    Per token, by precedence: ``mask`` False -> ids -1, weights +0.0; ``force_random``
    True -> ``P`` distinct random physical ids in ``[0, sum(logical_count))`` (or
    ``[0, E + S)``) with random weights in (0, 1], hashed from (``ep_rank``, token, slot);
    ``fix_routing_mask`` True -> the experts given in ``unmapped_topk_idx`` (duplicates
    kept). ``unmapped_topk_idx`` (if given) receives the logical routed experts (-1 for
    masked and force-random tokens), ``scores`` (if given) ``u`` (0 for those tokens).
    With ``to_physical_map [E + S, Dup]`` / ``logical_count [E + S]`` every logical id
    becomes replica ``(ep_rank + token * 23333) mod count`` of its row.

    Args:
        logits: Contiguous fp32 ``[T, E]``, ``E >= 1``.
        num_topk: Routed experts per token, ``1 <= num_topk <= min(E, 32)``.
        use_shared_as_routed: Append ``num_shared_experts`` shared-expert slots to every token.
        num_shared_experts: ``S``, 1 or 2 with ``use_shared_as_routed`` (an int >= 0, ignored,
            without).
        routed_scaling_factor: Multiplier of the routed weights (any real number).
        ep_rank: Expert-parallel rank in ``[0, 2^31 - 1]``; enters the replica choice and the
            force-random draws.
        scoring_func: Must be ``"sqrtsoftplus"``.
        mask: Optional bool, one element per token (any shape with ``T`` elements, contiguous):
            False pads the token (ids -1, weights +0.0).
        bias: Optional contiguous fp32 ``[E]`` added to the scores for ranking only.
        image_bias: Optional contiguous fp32 ``[E]``, used instead of ``bias`` for the tokens
            flagged in ``image_token_mask``; given together with it.
        image_token_mask: Optional per-token bool (``T`` elements, contiguous); given together
            with ``image_bias``.
        fix_routing_mask: Optional per-token bool (``T`` elements, contiguous): True takes the
            experts in ``unmapped_topk_idx`` (needs it).
        to_physical_map: Optional contiguous int32 ``[E + S, Dup]`` (``Dup >= 1``) of replica
            ids per logical expert; given together with ``logical_count``.
        logical_count: Optional contiguous int32 ``[E + S]``: replicas per logical expert,
            each in ``[1, Dup]``.
        unmapped_topk_idx: Optional int64 ``[T, num_topk]`` (unit column stride,
            non-overlapping rows, row stride < 2^31): read as the fixed experts of
            ``fix_routing_mask`` tokens, then written with the logical routed experts.
        force_random: Optional per-token bool (``T`` elements, contiguous): True routes the
            token at random.
        out: Optional preallocated ``(topk_idx, topk_weights)``: contiguous int64 and fp32
            ``[T, P]``.
        scores: Optional contiguous fp32 ``[T, E]`` that receives ``u``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``logits``.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the summation order of ``D`` and
            its quotient check.

    Returns:
        topk_idx: int64 ``[T, P]`` (physical ids with ``to_physical_map``, else logical);
            ``out[0]`` when given.
        topk_weights: fp32 ``[T, P]``; ``out[1]`` when given.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype (``logits``,
            ``bias`` and ``image_bias`` fp32; the per-token masks bool; ``to_physical_map`` and
            ``logical_count`` int32; ``unmapped_topk_idx`` int64; ``out`` int64/fp32; ``scores``
            fp32); ``num_topk``, ``num_shared_experts`` or ``ep_rank`` is not an int;
            ``use_shared_as_routed`` is not a bool; ``routed_scaling_factor`` is not a real
            number; ``out`` is not a 2-tuple.
        ValueError: Before any kernel: ``scoring_func`` is not ``"sqrtsoftplus"``; ``logits``
            is not 2-D or not contiguous or has no expert column; ``num_topk``,
            ``num_shared_experts`` or ``ep_rank`` is out of range; a tensor has the wrong shape
            or element count, stride or device; ``image_bias``/``image_token_mask`` or
            ``to_physical_map``/``logical_count`` is given without the other;
            ``fix_routing_mask`` without ``unmapped_topk_idx``; ``out``, ``scores`` or
            ``unmapped_topk_idx`` overlaps another output or an input.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran (the reference ``"torch"`` raises the same before
            writing): non-finite logits of routed tokens, fixed experts outside ``[0, E)``,
            replica counts outside ``[1, Dup]``, or force-random routing with fewer physical
            experts than slots; ``out``, ``scores`` and ``unmapped_topk_idx`` are then left as
            they were.
    """
    return MOE_TOPK_GATE_FORWARD(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor,
                                 ep_rank, scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask,
                                 to_physical_map, logical_count, unmapped_topk_idx, force_random, scores, out=out,
                                 target=target, flavor=flavor)


moe_topk_gate_forward_parallel = parallel_entry(moe_topk_gate_forward, "logits")


def moe_topk_gate(logits: torch.Tensor, num_topk: int, use_shared_as_routed: bool, num_shared_experts: int,
                  routed_scaling_factor: float, ep_rank: int, scoring_func: str = "sqrtsoftplus",
                  mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                  image_bias: torch.Tensor | None = None, image_token_mask: torch.Tensor | None = None,
                  fix_routing_mask: torch.Tensor | None = None, to_physical_map: torch.Tensor | None = None,
                  logical_count: torch.Tensor | None = None, unmapped_topk_idx: torch.Tensor | None = None,
                  force_random: torch.Tensor | None = None,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None, scores: torch.Tensor | None = None,
                  *, target: str | None = None,
                  flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``moe_topk_gate_forward`` under its TileKernels compatibility name.

    Same arguments, returns and errors as ``moe_topk_gate_forward``, which it calls.

    Returns:
        ``(topk_idx, topk_weights)``, as ``moe_topk_gate_forward`` returns them.
    """
    return moe_topk_gate_forward(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor,
                                 ep_rank, scoring_func, mask, bias, image_bias, image_token_mask, fix_routing_mask,
                                 to_physical_map, logical_count, unmapped_topk_idx, force_random, out, scores,
                                 target=target, flavor=flavor)
