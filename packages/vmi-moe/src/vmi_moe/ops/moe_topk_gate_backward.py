"""``moe_topk_gate_backward``: public dispatch (validation, allocation, backend choice).

The gradient of the sqrt-softplus gate's routed weights with respect to its logits,
plus the sequence-level auxiliary term. Names and parameters follow TileKernels
v2; ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vmi_core.checks import check_disjoint, check_float, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import check_scoring_func, check_topk, new_status, raise_status
from ..kernels import moe_topk_gate_backward as parallel
from ..reference import backward as reference
from ..reference import gate as gate_reference
from .demo import SCALE, SOURCE_EXPERTS, SUPPORT, close, padding_mask

MAX_TOKENS_PER_SEQ = 2**31 - 1


@dataclass
class GateBackwardCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.GateBackwardSpec
    scores: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    grad_topk_weights: torch.Tensor
    mask: torch.Tensor | None
    grad_scores_sum: torch.Tensor | None
    grad_logits: torch.Tensor
    status: torch.Tensor
    routed_scaling_factor: float
    tokens_per_seq: int
    out_given: bool = False


def _prepare(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask,
             grad_scores_sum, out, target, flavor):
    check_scoring_func("moe_topk_gate_backward", scoring_func)
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    target = resolve_target(scores, target)
    flavor = resolve_flavor(target, flavor)
    device = scores.device
    check_tensor(scores, "scores", dtype=torch.float32, shape=(None, None), contiguous=True)
    num_tokens, num_experts = scores.shape
    if num_experts == 0:
        raise ValueError("scores must have at least one expert column")
    check_tensor(topk_idx, "topk_idx", dtype=torch.int64, shape=(num_tokens, None), device=device, contiguous=False)
    if topk_idx.shape[1] > 1 and topk_idx.stride(1) != 1:
        raise ValueError(f"topk_idx must have unit column stride, got strides {tuple(topk_idx.stride())}")
    # The forward writes a row-strided unmapped_topk_idx; the kernel reads packed rows.
    topk_idx = topk_idx.contiguous()
    num_topk = check_topk(topk_idx.shape[1], num_experts, "topk_idx.size(1) (num_topk)")
    check_tensor(topk_weights, "topk_weights", dtype=torch.float32, shape=(num_tokens, num_topk),
                 device=device, contiguous=True)
    check_tensor(grad_topk_weights, "grad_topk_weights", dtype=torch.float32, shape=(num_tokens, num_topk),
                 device=device, contiguous=True)
    scale = check_float(routed_scaling_factor, "routed_scaling_factor")
    if (mask is None) != (grad_scores_sum is None):
        raise ValueError("mask and grad_scores_sum must be given together (the auxiliary term needs both)")
    tokens_per_seq = 0
    if mask is not None:
        check_tensor(mask, "mask", dtype=torch.bool, shape=(num_tokens,), device=device, contiguous=True)
        check_tensor(grad_scores_sum, "grad_scores_sum", dtype=torch.float32, shape=(None, num_experts),
                     device=device, contiguous=True)
        num_seqs = grad_scores_sum.shape[0]
        if num_seqs == 0 or num_tokens % num_seqs:
            raise ValueError(f"the number of tokens ({num_tokens}) must be a multiple of the number of sequences "
                             f"(grad_scores_sum.size(0) = {num_seqs})")
        tokens_per_seq = num_tokens // num_seqs
        if tokens_per_seq > MAX_TOKENS_PER_SEQ:
            raise ValueError(f"tokens per sequence must fit int32, got {tokens_per_seq}")
    if out is not None:
        check_tensor(out, "out", dtype=torch.float32, shape=(num_tokens, num_experts), device=device, contiguous=True)
        check_disjoint({"out": out}, {"scores": scores, "topk_idx": topk_idx, "topk_weights": topk_weights,
                                      "grad_topk_weights": grad_topk_weights, "mask": mask,
                                      "grad_scores_sum": grad_scores_sum})
        grad_logits = out
    else:
        grad_logits = torch.empty_like(scores)
    spec = parallel.GateBackwardSpec(num_experts, num_topk, flavor.name, has_aux=mask is not None)
    call = GateBackwardCall(spec, scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum,
                            grad_logits, new_status(device), scale, tokens_per_seq, out is not None)
    return target, call


def _run(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask,
         grad_scores_sum, *, out, target, flavor, launch):
    target, call = _prepare(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func,
                            mask, grad_scores_sum, out and out[0], target, flavor)
    if launch and target == "torch":
        call.grad_logits.copy_(reference.moe_topk_gate_backward(
            call.scores, call.topk_idx, call.topk_weights, call.grad_topk_weights, call.routed_scaling_factor,
            mask=call.mask, grad_scores_sum=call.grad_scores_sum))
    elif launch and call.scores.shape[0]:
        # A caller's out gets the gradient only once the kernel's flags are clear.
        staged = replace(call, grad_logits=torch.empty_like(call.grad_logits)) if call.out_given else call
        parallel.launch(staged, target)
        raise_status(staged.status, "moe_topk_gate_backward", "scores", "topk_idx")
        if staged is not call:
            call.grad_logits.copy_(staged.grad_logits)
    return call.grad_logits


def _inputs(shape, options, seed):
    num_tokens, num_experts = shape
    k, num_seqs = options["num_topk"], options["num_sequences"]
    g = generator(seed)
    mask = padding_mask(num_tokens)
    _, weights, unmapped, scores = gate_reference.moe_topk_gate_forward(
        torch.randn(shape, generator=g), k, False, 0, SCALE, 0, mask=mask, bias=torch.randn(num_experts, generator=g),
        unmapped_topk_idx=torch.empty(num_tokens, k, dtype=torch.int64))
    inputs = {"scores": scores, "topk_idx": unmapped, "topk_weights": weights,
              "grad_topk_weights": torch.randn(num_tokens, k, generator=g), "mask": None, "grad_scores_sum": None}
    if num_seqs:
        inputs.update(mask=mask, grad_scores_sum=torch.randn(num_seqs, num_experts, generator=g))
    return inputs


def _check(outputs, expected) -> list[str]:
    (grad,), (want,) = outputs, expected
    # Not bitwise: the kernel computes in fp32 (E-term sums, exp, divisions) and the reference in
    # float64; the spec's tolerance (measured error ~1e-7 of max|reference|).
    return close("grad_logits", grad, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()) if want.numel() else 0.0)


def _kernels(options, target, flavor):
    """The backward kernel as the dispatch specialises it (``_prepare``) for a call with these options."""
    k, num_seqs = options["num_topk"], options["num_sequences"]
    num_tokens = max(num_seqs, 1)
    scores = torch.empty(num_tokens, SOURCE_EXPERTS, device="meta")
    weights = torch.empty(num_tokens, k, device="meta")
    mask, grad_scores_sum = None, None
    if num_seqs > 0:
        mask = torch.empty(num_tokens, dtype=torch.bool, device="meta")
        grad_scores_sum = torch.empty(num_seqs, SOURCE_EXPERTS, device="meta")
    _, call = _prepare(scores, torch.empty(num_tokens, k, dtype=torch.int64, device="meta"), weights,
                       torch.empty_like(weights), SCALE, "sqrtsoftplus", mask, grad_scores_sum, None, target, flavor)
    return [(parallel.build_moe_topk_gate_backward, call.spec)]


# The default two sequences need an even number of tokens.
_BACKWARD_SHAPES = ((16384, 256), (4096, 384), (1024, 72), (2, 256), (4, 256), (16, 256))

MOE_TOPK_GATE_BACKWARD = KernelOp(
    "moe_topk_gate_backward",
    (Param("scores", "Tensor"), Param("topk_idx", "Tensor"), Param("topk_weights", "Tensor"),
     Param("grad_topk_weights", "Tensor"), Param("routed_scaling_factor", "float"),
     Param("scoring_func", "str", "sqrtsoftplus"), Param("mask", "Tensor", None, optional=True),
     Param("grad_scores_sum", "Tensor", None, optional=True)),
    ("grad_logits",), _run, outs=("out",),
    command=Command(
        summary="gradient of the MoE gate's weights and sequence-level auxiliary statistic w.r.t. the logits",
        support=SUPPORT,
        default_shape=(4096, 256),
        bench_shapes=_BACKWARD_SHAPES,
        make_inputs=_inputs,
        kernels=_kernels,
        options=(
            Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "routed experts per token"),
            Option("num_sequences", 2, help="sequences for the auxiliary term (0: no auxiliary term)"),
        ),
        arguments=lambda inputs, options, flavor: {"routed_scaling_factor": SCALE},
        check=_check,
        check_criterion="to rtol 1e-5, atol 1e-5 * max|reference|",
    ))


def moe_topk_gate_backward(scores: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                           grad_topk_weights: torch.Tensor, routed_scaling_factor: float,
                           scoring_func: str = "sqrtsoftplus", mask: torch.Tensor | None = None,
                           grad_scores_sum: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                           target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """The gradient of the gate's routed weights and auxiliary statistic with respect to its logits.

    Route term per valid slot: ``(s * g_j - <g, w>) / (sum(u_sel) + 1e-20)``, accumulated
    per expert (fixed-routing duplicates add up). With ``mask`` and ``grad_scores_sum``
    (the gradient of the per-sequence sums of ``u / sum(u)`` over tokens with ``mask``
    True), sequences are ``T / Nseq`` consecutive tokens and each token adds
    ``(h - <h, u> / U) / U`` with its own sequence's ``h``.
    Everything is multiplied by ``d sqrt(softplus(x)) / dx`` computed from ``u``; padded
    tokens (ids -1, scores 0) get +0.0.

    Args:
        scores: The forward's ``u = sqrt(softplus(logits))``, contiguous fp32 ``[T, E]``.
        topk_idx: The *logical routed* experts, int64 ``[T, K]`` with
            ``1 <= K <= min(E, 32)``, unit column stride (any row stride), -1 for unused slots
            (the forward's ``unmapped_topk_idx``, not physical or shared ids).
        topk_weights: The forward's first ``K`` weight columns, contiguous fp32 ``[T, K]``.
        grad_topk_weights: Their upstream gradient, contiguous fp32 ``[T, K]``.
        routed_scaling_factor: The forward's ``routed_scaling_factor`` (any real number).
        scoring_func: Must be ``"sqrtsoftplus"``.
        mask: Optional contiguous bool ``[T]``, the tokens of the auxiliary statistic; given
            together with ``grad_scores_sum``.
        grad_scores_sum: Optional contiguous fp32 ``[Nseq, E]``, ``Nseq >= 1`` dividing
            ``T``; given together with ``mask``.
        out: Optional preallocated contiguous fp32 ``[T, E]``; must not overlap an input.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``scores``.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the evaluation order of the
            auxiliary term.

    Returns:
        ``grad_logits``, fp32 ``[T, E]`` (contiguous, new, or ``out`` when given).

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype;
            ``routed_scaling_factor`` is not a real number.
        ValueError: Before any kernel: ``scoring_func`` is not ``"sqrtsoftplus"``; ``scores``
            is not 2-D or not contiguous or has no expert column; a tensor has the wrong shape,
            stride or device; ``K`` is out of range; ``mask`` and ``grad_scores_sum`` are not
            given together, or ``Nseq`` does not divide ``T``; ``out`` overlaps an input.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran (the reference ``"torch"`` raises the same before
            computing): ``topk_idx`` holds an id outside ``[0, E)`` other than -1, or ``scores``
            holds a NaN or infinity (the forward writes finite scores, 0 for padded and
            random-routed tokens); ``out`` is then left as it was.
    """
    return MOE_TOPK_GATE_BACKWARD(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor,
                                  scoring_func, mask, grad_scores_sum, out=None if out is None else (out,),
                                  target=target, flavor=flavor)


moe_topk_gate_backward_parallel = parallel_entry(moe_topk_gate_backward, "scores")
