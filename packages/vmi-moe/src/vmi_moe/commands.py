"""vmi-moe's ops for the ``vmi`` command (entry point group ``vmi.ops``).

Shapes are ``(tokens, experts)``. ``topk_gate`` and ``normalize_weight`` are checked bit
for bit. The gate's scores come from ``exp``/``log1p`` (<= 2 ulp from the reference),
so ``moe_topk_gate`` is checked as its tests do: scores and weights within a
tolerance, each token's set of experts bit for bit on inputs without near-ties at the
top-k boundary. The backward is checked against the float64 reference within the
spec's tolerance. Each entry is built from the op's declaration (``kernel_op_entry``).
"""

from __future__ import annotations

import torch

from vmi_core.registry import Option, kernel_op_entry
from vmi_core.softplus import sqrt_softplus
from vmi_core.targets import flavor_argument, resolve_flavor
from vmi_core.testing import bitwise_mismatches, generator, randn

from . import reference
from .kernels.moe_topk_gate import GateSpec, build_moe_topk_gate
from .kernels.moe_topk_gate_backward import GateBackwardSpec, build_moe_topk_gate_backward
from .kernels.normalize_weight import NormalizeWeightSpec, build_normalize_weight
from .kernels.topk_gate import TopkGateSpec, build_topk_gate
from .ops.moe_topk_gate import MOE_TOPK_GATE_FORWARD
from .ops.moe_topk_gate_backward import MOE_TOPK_GATE_BACKWARD
from .ops.normalize_weight import NORMALIZE_WEIGHT
from .ops.topk_gate import TOPK_GATE

_SCALE = 1.5
# Keys of the K-th and (K+1)-th expert closer than this make the selected set depend on
# the last ulps of the scores; such rows are re-drawn (as TileKernels' tests do).
_MIN_GAP = 1e-6
# Padded (masked) tokens at the tail of the batch, as a fraction of the tokens.
_PADDED_FRACTION = 0.01


def _flavor_of(target, flavor):
    return resolve_flavor(target, flavor_argument(target, flavor)).name


def _close(name, actual, wanted, rtol, atol) -> list[str]:
    actual = actual.cpu()
    if actual.shape != wanted.shape:
        return [f"  {name}: shape {tuple(actual.shape)} vs expected {tuple(wanted.shape)}"]
    bad = ~torch.isclose(actual, wanted, rtol=rtol, atol=atol)
    if not bad.any():
        return []
    first = tuple(int(i) for i in bad.nonzero()[0])
    return [f"  {name}: {int(bad.sum())} values outside rtol={rtol:g} atol={atol:g}, first at {first}: "
            f"{actual[first].item()!r} vs {wanted[first].item()!r}"]


# --- topk_gate ---

TOPK_OPTIONS = (Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "experts per token"),)


def _topk_inputs(shape, options, seed):
    return {"scores": randn(shape, seed)}


def _topk_source(options, target, flavor):
    return build_topk_gate.source(TopkGateSpec(256, options["num_topk"]), target)


# --- normalize_weight ---

NORMALIZE_OPTIONS = (Option("num_topk", 8, tuple(range(1, 33)), "weights per row"),)


def _normalize_inputs(shape, options, seed):
    return {"topk_weights": torch.rand(shape[0], options["num_topk"], generator=generator(seed))}


def _normalize_source(options, target, flavor):
    return build_normalize_weight.source(NormalizeWeightSpec(options["num_topk"], _flavor_of(target, flavor)), target)


# --- moe_topk_gate ---

GATE_OPTIONS = (
    Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "routed experts per token"),
    Option("num_shared_experts", 0, (0, 1, 2), "shared experts appended as routed slots"),
    Option("bias", True, help="selection bias"),
    Option("mask", True, help="pad the last 1% of the tokens"),
)


def _gate_inputs(shape, options, seed):
    num_tokens, num_experts = shape
    k = options["num_topk"]
    g = generator(seed)
    logits = torch.randn(shape, generator=g)
    bias = torch.randn(num_experts, generator=g) if options["bias"] else None
    # Re-draw rows whose top-k set is ambiguous to within _MIN_GAP.
    for _ in range(100):
        if k == num_experts:
            break
        keys = sqrt_softplus(logits) + (0.0 if bias is None else bias)
        top = keys.topk(k + 1, dim=1).values
        close = (top[:, k - 1] - top[:, k]) <= _MIN_GAP
        if not close.any():
            break
        logits[close] = torch.randn(int(close.sum()), num_experts, generator=g)
    mask = None
    if options["mask"]:
        mask = torch.ones(num_tokens, dtype=torch.bool)
        mask[num_tokens - int(num_tokens * _PADDED_FRACTION):] = False
    return {"logits": logits, "bias": bias, "mask": mask}


def _gate_arguments(inputs, options, flavor):
    return {"use_shared_as_routed": options["num_shared_experts"] > 0, "routed_scaling_factor": _SCALE,
            "ep_rank": 0, "scores": torch.empty_like(inputs["logits"])}


def _gate_check(outputs, expected) -> list[str]:
    (idx, weights, scores), (want_idx, want_weights, want_scores) = outputs, expected
    order, want_order = idx.cpu().sort(dim=1), want_idx.sort(dim=1)
    lines = [f"  topk_idx (sorted per token){line}"
             for line in bitwise_mismatches(order.values, want_order.values)]
    if lines:
        return lines
    # Same sets: compare the weights slot by slot in the sorted order. Not bitwise: the scores come
    # from exp/log1p (kernel <= 2 ulp from the float64 reference), and a weight carries that error
    # through u / sum(u); rtol 1e-5 is the spec's test tolerance (bitwise checks given the kernel's
    # own scores are in tests/test_moe_topk_gate.py).
    lines += _close("topk_weights", weights.cpu().gather(1, order.indices), want_weights.gather(1, want_order.indices),
                    rtol=1e-5, atol=1e-8)
    lines += _close("scores", scores, want_scores, rtol=1e-5, atol=1e-8)
    return lines


def _gate_source(options, target, flavor):
    shared = options["num_shared_experts"]
    spec = GateSpec(256, options["num_topk"], shared, 1, _flavor_of(target, flavor), has_mask=options["mask"],
                    has_bias=options["bias"], has_scores=True)
    return build_moe_topk_gate.source(spec, target)


# --- moe_topk_gate_backward ---

BACKWARD_OPTIONS = (
    Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "routed experts per token"),
    Option("num_sequences", 2, help="sequences for the auxiliary term (0: no auxiliary term)"),
)


def _backward_inputs(shape, options, seed):
    num_tokens, num_experts = shape
    k, num_seqs = options["num_topk"], options["num_sequences"]
    g = generator(seed)
    mask = torch.ones(num_tokens, dtype=torch.bool)
    mask[num_tokens - int(num_tokens * _PADDED_FRACTION):] = False
    _, weights, unmapped, scores = reference.moe_topk_gate_forward(
        torch.randn(shape, generator=g), k, False, 0, _SCALE, 0, mask=mask, bias=torch.randn(num_experts, generator=g),
        unmapped_topk_idx=torch.empty(num_tokens, k, dtype=torch.int64))
    inputs = {"scores": scores, "topk_idx": unmapped, "topk_weights": weights,
              "grad_topk_weights": torch.randn(num_tokens, k, generator=g), "mask": None, "grad_scores_sum": None}
    if num_seqs:
        inputs.update(mask=mask, grad_scores_sum=torch.randn(num_seqs, num_experts, generator=g))
    return inputs


def _backward_check(outputs, expected) -> list[str]:
    (grad,), (want,) = outputs, expected
    # Not bitwise: the kernel computes in fp32 (E-term sums, exp, divisions) and the reference in
    # float64; the spec's tolerance (measured error ~1e-7 of max|reference|).
    return _close("grad_logits", grad, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()) if want.numel() else 0.0)


def _backward_source(options, target, flavor):
    spec = GateBackwardSpec(256, options["num_topk"], _flavor_of(target, flavor), has_aux=options["num_sequences"] > 0)
    return build_moe_topk_gate_backward.source(spec, target)


_PARALLEL_TARGETS = {
    "cpu": "runs; checked against the reference in both flavors",
    "ascend": "lowers to AscendC (SIMD and SIMT vector regions); runs on ascend-sim, not yet on an NPU",
    "ascend-sim": "runs the ascend source on the CPU model; checked against the reference (ascend flavor)",
    "cuda": "lowers and compiles with nvcc (sm_90a); not run without a GPU",
}
# Prefill sizes (throughput) and decode sizes (1, 4, 16 tokens: microseconds per call).
_SHAPES = ((16384, 256), (4096, 384), (1024, 72), (1, 256), (4, 256), (16, 256))
# The backward's default two sequences need an even number of tokens.
_BACKWARD_SHAPES = ((16384, 256), (4096, 384), (1024, 72), (2, 256), (4, 256), (16, 256))

OPS = [
    kernel_op_entry(
        TOPK_GATE,
        family="moe",
        summary="top-k expert indices per token, ties to the lowest index",
        default_shape=(4096, 256),
        bench_shapes=_SHAPES,
        options=TOPK_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_topk_inputs,
        source=_topk_source,
    ),
    kernel_op_entry(
        NORMALIZE_WEIGHT,
        family="moe",
        summary="renormalise selected expert weights, summed in the gate's order",
        default_shape=(16384, 8),
        bench_shapes=((65536, 8), (16384, 8), (4096, 6), (1, 8), (4, 8), (16, 8)),
        options=NORMALIZE_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_normalize_inputs,
        source=_normalize_source,
    ),
    kernel_op_entry(
        MOE_TOPK_GATE_FORWARD,
        arguments=_gate_arguments,
        check=_gate_check,
        name="moe_topk_gate",
        family="moe",
        summary="sqrt-softplus MoE top-k gate: biased selection, normalised scaled weights, shared experts",
        default_shape=(4096, 256),
        bench_shapes=_SHAPES,
        options=GATE_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_gate_inputs,
        source=_gate_source,
        aliases=("moe_topk_gate_forward",),
        check_criterion="(expert sets bit for bit; weights and scores to rtol 1e-5)",
    ),
    kernel_op_entry(
        MOE_TOPK_GATE_BACKWARD,
        arguments=lambda inputs, options, flavor: {"routed_scaling_factor": _SCALE},
        check=_backward_check,
        family="moe",
        summary="gradient of the MoE gate's weights and sequence-level auxiliary statistic w.r.t. the logits",
        default_shape=(4096, 256),
        bench_shapes=_BACKWARD_SHAPES,
        options=BACKWARD_OPTIONS,
        targets=_PARALLEL_TARGETS,
        make_inputs=_backward_inputs,
        source=_backward_source,
        check_criterion="to rtol 1e-5, atol 1e-5 * max|reference|",
    ),
]
