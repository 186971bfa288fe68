"""``pre_apply_mix``: public dispatch (validation, allocation, backend choice).

The weighted sum of a token's ``n`` residual streams that becomes the sublayer's input, and its
backward. Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions
(see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_in_place, check_kernel_extent, check_tensor, mark_written
from vmi_core.library import Command, KernelOp, Param, parallel_entry, support
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator, randn

from ..inputs import check_streams
from ..kernels import pre_apply_mix as parallel
from ..reference import pre_apply_mix as reference
from .demo import SOURCE_HIDDEN, STREAM_OPTIONS, STREAM_SHAPES, streams


@dataclass
class PreApplyMixFwdCall:
    """A validated forward call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.PreApplyMixFwdSpec
    x: torch.Tensor
    mix: torch.Tensor
    o: torch.Tensor


@dataclass
class PreApplyMixBwdCall:
    """A validated backward call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.PreApplyMixBwdSpec
    o_grad: torch.Tensor
    x: torch.Tensor
    mix: torch.Tensor
    x_grad: torch.Tensor
    mix_grad: torch.Tensor


def _check_streams_tensor(x, name: str) -> tuple[int, int, int]:
    check_tensor(x, name, dtype=torch.bfloat16, dim=3, contiguous=True)
    num_tokens, n, hidden = x.shape
    check_streams(n, f"{name}.size(1) (the number of streams)")
    if hidden == 0:
        raise ValueError(f"{name} must have a hidden size of at least 1, got shape {tuple(x.shape)}")
    check_kernel_extent(x, name)
    return num_tokens, n, hidden


def _check_mix(mix, num_tokens: int, n: int, device) -> torch.Tensor:
    """``mix`` as ``(T, n)``: given as ``(T, n)`` or ``(T, n, 1)``, fp32, contiguous."""
    check_tensor(mix, "mix", dtype=torch.float32, contiguous=True)
    if tuple(mix.shape) not in ((num_tokens, n), (num_tokens, n, 1)):
        raise ValueError(f"mix must have shape ({num_tokens}, {n}) or ({num_tokens}, {n}, 1), got {tuple(mix.shape)}")
    check_tensor(mix, "mix", device=device)
    return mix.view(num_tokens, n)


def _run_fwd(x, mix, *, out, target, flavor, launch):
    num_tokens, n, hidden = _check_streams_tensor(x, "x")
    mix = _check_mix(mix, num_tokens, n, x.device)
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    if out is not None and out[0] is not None:
        o = out[0]
        check_tensor(o, "o", dtype=torch.bfloat16, shape=(num_tokens, hidden), device=x.device, contiguous=True)
        check_in_place(o, "o", "mhc_pre_apply_mix_fwd")
        check_disjoint({"o": o}, {"x": x, "mix": mix})
    else:
        o = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=x.device)
    if launch and target == "torch":
        o.copy_(reference.mhc_pre_apply_mix_fwd(x, mix, flavor.name))
    elif launch and num_tokens:
        parallel.launch_fwd(PreApplyMixFwdCall(parallel.PreApplyMixFwdSpec(n, flavor.name), x, mix, o), target)
    return o


def _run_bwd(o_grad, x, mix, x_grad, *, out, target, flavor, launch):
    num_tokens, n, hidden = _check_streams_tensor(x, "x")
    max_hidden = parallel.max_hidden(n)
    if hidden > max_hidden:
        raise ValueError(f"x's hidden size must be at most {max_hidden} for {n} streams (a token's o_grad, x "
                         f"and x_grad rows fill a cuda block's shared memory), got {hidden}")
    check_tensor(o_grad, "o_grad", dtype=torch.bfloat16, shape=(num_tokens, hidden), device=x.device,
                 contiguous=True)
    mix = _check_mix(mix, num_tokens, n, x.device)
    check_tensor(x_grad, "x_grad", dtype=torch.bfloat16, shape=(num_tokens, n, hidden), device=x.device,
                 contiguous=True)
    check_in_place(x_grad, "x_grad", "mhc_pre_apply_mix_bwd")
    check_disjoint({"x_grad": x_grad}, {"o_grad": o_grad, "x": x, "mix": mix})
    target = resolve_target(x, target)
    resolve_flavor(target, flavor)
    mix_grad = torch.empty((num_tokens, n), dtype=torch.float32, device=x.device)
    if launch and target == "torch":
        new_x_grad, expected_mix_grad = reference.mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
        x_grad.copy_(new_x_grad)
        mix_grad.copy_(expected_mix_grad)
    elif launch and num_tokens:
        call = PreApplyMixBwdCall(parallel.PreApplyMixBwdSpec(n, hidden), o_grad, x, mix, x_grad, mix_grad)
        parallel.launch_bwd(call, target)
        mark_written(x_grad)
    return mix_grad


def _mix(num_tokens, n, seed):
    return torch.softmax(torch.randn(num_tokens, n, generator=generator(seed)), dim=-1)


def _fwd_inputs(shape, options, seed):
    n = options["mhc_mult"]
    return {"x": streams(shape, n, seed), "mix": _mix(shape[0], n, seed + 1)}


MHC_PRE_APPLY_MIX_FWD = KernelOp(
    "mhc_pre_apply_mix_fwd", (Param("x", "Tensor"), Param("mix", "Tensor")), ("o",), _run_fwd, outs=("o",),
    command=Command(
        summary="sublayer input: the mix-weighted sum of a token's n streams (the flavor's fp32 fma chain)",
        support=support(), default_shape=(4096, 4096), bench_shapes=STREAM_SHAPES, options=STREAM_OPTIONS,
        make_inputs=_fwd_inputs,
        kernels=lambda options, target, flavor: [
            (parallel.build_pre_apply_mix_fwd, parallel.PreApplyMixFwdSpec(options["mhc_mult"], flavor))]))


def _bwd_inputs(shape, options, seed):
    n = options["mhc_mult"]
    return {"o_grad": randn(shape, seed + 2, torch.bfloat16), "x": streams(shape, n, seed),
            "mix": _mix(shape[0], n, seed + 1), "x_grad": randn((shape[0], n, shape[1]), seed + 3, torch.bfloat16)}


MHC_PRE_APPLY_MIX_BWD = KernelOp(
    "mhc_pre_apply_mix_bwd",
    (Param("o_grad", "Tensor"), Param("x", "Tensor"), Param("mix", "Tensor"),
     Param("x_grad", "Tensor", mutable=True)),
    ("mix_grad",), _run_bwd,
    command=Command(
        summary="gradients of pre_apply_mix: stream gradients accumulated in place, per-token mix "
                "gradients (fixed-order sums)",
        support=support(), default_shape=(4096, 4096), bench_shapes=STREAM_SHAPES, options=STREAM_OPTIONS,
        make_inputs=_bwd_inputs,
        kernels=lambda options, target, flavor: [
            (parallel.build_pre_apply_mix_bwd, parallel.PreApplyMixBwdSpec(options["mhc_mult"], SOURCE_HIDDEN))]))


def mhc_pre_apply_mix_fwd(x: torch.Tensor, mix: torch.Tensor, o: torch.Tensor, *, target: str | None = None,
                          flavor: str | None = None) -> torch.Tensor:
    """The weighted sum of a token's streams: ``o[t] = bf16(Σ_m mix[t, m] · f32(x[t, m]))``.

    The fp32 chain runs over the streams in increasing order and is rounded to bf16 once
    (nearest, ties to even). Per flavor (``vmi_mhc.tl.mix``, which the fused kernels share):
    ``ascend`` starts from the product ``mix[0] · x[0]`` and adds each next stream with a fused
    multiply-add, ``acc = fma(mix[m], x[m], acc)``; ``cuda`` starts from +0 and fuses every stream,
    including the first. The two differ only in the sign of an all-zero result (ascend: -0 when
    every product is -0; cuda: always +0). Non-finite values follow IEEE arithmetic (a NaN or an
    infinite weight or stream value reaches every column it enters; ``0 · inf`` is NaN); the sign
    and payload of a NaN output are not specified.

    Args:
        x: The streams, contiguous bf16 ``(T, n, H)`` with ``1 <= n <= 16`` and ``H >= 1``.
        mix: The weights, contiguous fp32 ``(T, n)`` or ``(T, n, 1)`` on x's device.
        o: The output, contiguous bf16 ``(T, H)`` on x's device; it is overwritten (and returned)
            and must not share memory with ``x`` or ``mix``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``). The flavor gives the first step of the chain
            (above).

    Returns:
        ``o``, written.

    Raises:
        TypeError: ``x``, ``mix`` or ``o`` is not a tensor or has the wrong dtype.
        ValueError: ``x`` is not 3-D or not contiguous, has a stream count outside ``[1, 16]`` or
            no hidden column; ``mix`` or ``o`` has the wrong shape, is not contiguous or is on
            another device; ``o`` shares memory with ``x`` or ``mix``; a tensor is too large for
            32-bit kernel offsets.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and ``o`` requires grad.
    """
    if not isinstance(o, torch.Tensor):
        raise TypeError(f"o must be a torch.Tensor, got {type(o).__name__}")
    return MHC_PRE_APPLY_MIX_FWD(x, mix, out=(o,), target=target, flavor=flavor)


mhc_pre_apply_mix_fwd_parallel = parallel_entry(mhc_pre_apply_mix_fwd, "x")


def mhc_pre_apply_mix_bwd(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor, x_grad: torch.Tensor, *,
                          target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """The gradients of ``mhc_pre_apply_mix_fwd``: the streams' accumulated into ``x_grad``, the
    weights' returned.

    ``x_grad[t, m] = bf16(fma(mix[t, m], f32(o_grad[t]), f32(x_grad[t, m])))``: one rounding per
    element, in place (pass zeros for a plain gradient). ``mix_grad[t, m] = Σ_h f32(o_grad[t, h]) ·
    f32(x[t, m, h])`` in vmi's fixed 64-lane order (``vmi_core.sums.lane_sum_fused``: 64 partial
    sums over the columns ``l, l + 64, ...``, each product fused into its partial, then six
    pairwise folds), the whole sum of a token in one worker. Both flavors give the same bits. With
    no tokens nothing runs and ``mix_grad`` is empty. Non-finite values follow IEEE arithmetic: a
    NaN or infinity in a token's ``o_grad`` reaches its ``x_grad`` elements of that column and
    every ``mix_grad`` entry of the token; the sign and payload of a NaN output are not specified.

    Args:
        o_grad: The gradient of ``o``, contiguous bf16 ``(T, H)`` on x's device.
        x: The forward's streams, contiguous bf16 ``(T, n, H)`` with ``1 <= n <= 16`` and
            ``1 <= H <= max_hidden(n)`` (12672 for ``n = 4``: a token's rows of ``o_grad``, ``x``
            and ``x_grad`` fill a cuda block's shared memory, which is smaller than the Ascend
            vector core's unified buffer; the same bound holds on every target).
        mix: The forward's weights, contiguous fp32 ``(T, n)`` or ``(T, n, 1)`` on x's device.
        x_grad: The stream gradients, contiguous bf16 ``(T, n, H)`` on x's device, accumulated into
            in place; it must not share memory with ``o_grad``, ``x`` or ``mix``.
        target: As for ``mhc_pre_apply_mix_fwd``.
        flavor: As for ``mhc_pre_apply_mix_fwd`` (both give the same bits here).

    Returns:
        ``mix_grad``, a new fp32 ``(T, n)`` tensor.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype.
        ValueError: ``x`` is not 3-D or not contiguous, has a stream count outside ``[1, 16]``, or
            a hidden size outside ``[1, max_hidden(n)]``; another tensor has the wrong shape, is
            not contiguous or is on another device; ``x_grad`` shares memory with an input; a
            tensor is too large for 32-bit kernel offsets.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and ``x_grad`` requires grad.
    """
    return MHC_PRE_APPLY_MIX_BWD(o_grad, x, mix, x_grad, target=target, flavor=flavor)


mhc_pre_apply_mix_bwd_parallel = parallel_entry(mhc_pre_apply_mix_bwd, "x")
