"""``expand``: public dispatch (validation, allocation, backend choice).

Widens a hidden state into ``n`` residual streams (the model's entry into the mHC residual) and
sums the streams' gradients back. Names and parameters follow TileKernels v2; ``target`` and
``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_in_place, check_int, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Param, parallel_entry, support
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import randn

from ..inputs import check_streams
from ..kernels import expand as parallel
from ..reference import expand as reference
from .demo import STREAM_OPTIONS, STREAM_SHAPES


@dataclass
class ExpandFwdCall:
    """A validated forward call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.ExpandSpec
    x: torch.Tensor
    o: torch.Tensor


@dataclass
class ExpandBwdCall:
    """A validated backward call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.ExpandSpec
    o_grad: torch.Tensor
    x_grad: torch.Tensor


def _check_hidden(t, name: str, dim: int) -> torch.Tensor:
    check_tensor(t, name, dtype=torch.bfloat16, dim=dim, contiguous=True)
    if t.shape[-1] == 0:
        raise ValueError(f"{name} must have a hidden size of at least 1, got shape {tuple(t.shape)}")
    return check_kernel_extent(t, name)


def _run_fwd(x, mhc_mult, *, out, target, flavor, launch):
    _check_hidden(x, "x", 2)
    n = check_streams(check_int(mhc_mult, "mhc_mult"), "mhc_mult")
    target = resolve_target(x, target)
    resolve_flavor(target, flavor)
    num_tokens, hidden = x.shape
    if out is not None and out[0] is not None:
        o = out[0]
        check_tensor(o, "o", dtype=torch.bfloat16, shape=(num_tokens, n, hidden), device=x.device, contiguous=True)
        check_kernel_extent(o, "o")
        check_in_place(o, "o", "expand_to_mhc_fwd")
        check_disjoint({"o": o}, {"x": x})
    else:
        o = torch.empty((num_tokens, n, hidden), dtype=torch.bfloat16, device=x.device)
        check_kernel_extent(o, "o")
    if launch and target == "torch":
        o.copy_(reference.expand_to_mhc_fwd(x, n))
    elif launch and num_tokens:
        parallel.launch_fwd(ExpandFwdCall(parallel.ExpandSpec(n), x, o), target)
    return o


def _run_bwd(o_grad, *, out, target, flavor, launch):
    _check_hidden(o_grad, "o_grad", 3)
    num_tokens, n, hidden = o_grad.shape
    check_streams(n, "o_grad.size(1) (the number of streams)")
    target = resolve_target(o_grad, target)
    resolve_flavor(target, flavor)
    if out is not None and out[0] is not None:
        x_grad = out[0]
        check_tensor(x_grad, "x_grad", dtype=torch.bfloat16, shape=(num_tokens, hidden), device=o_grad.device,
                     contiguous=True)
        check_in_place(x_grad, "x_grad", "expand_to_mhc_bwd")
        check_disjoint({"x_grad": x_grad}, {"o_grad": o_grad})
    else:
        x_grad = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=o_grad.device)
    if launch and target == "torch":
        x_grad.copy_(reference.expand_to_mhc_bwd(o_grad))
    elif launch and num_tokens:
        parallel.launch_bwd(ExpandBwdCall(parallel.ExpandSpec(n), o_grad, x_grad), target)
    return x_grad


def _kernels(build):
    return lambda options, target, flavor: [(build, parallel.ExpandSpec(options["mhc_mult"]))]


EXPAND_TO_MHC_FWD = KernelOp(
    "expand_to_mhc_fwd", (Param("x", "Tensor"), Param("mhc_mult", "int")), ("o",), _run_fwd, outs=("o",),
    command=Command(
        summary="widen a hidden state into n residual streams (a bit copy per stream)",
        support=support(), default_shape=(4096, 4096), bench_shapes=STREAM_SHAPES, options=STREAM_OPTIONS,
        make_inputs=lambda shape, options, seed: {"x": randn(shape, seed, torch.bfloat16)},
        kernels=_kernels(parallel.build_expand_fwd)))


def _bwd_inputs(shape, options, seed):
    return {"o_grad": randn((shape[0], options["mhc_mult"], shape[1]), seed, torch.bfloat16)}


EXPAND_TO_MHC_BWD = KernelOp(
    "expand_to_mhc_bwd", (Param("o_grad", "Tensor"),), ("x_grad",), _run_bwd, outs=("x_grad",),
    command=Command(
        summary="gradient of expand: the fp32 sum of the n stream gradients, rounded to bf16 once",
        support=support(), default_shape=(4096, 4096), bench_shapes=STREAM_SHAPES, options=STREAM_OPTIONS,
        make_inputs=_bwd_inputs, kernels=_kernels(parallel.build_expand_bwd)))


def expand_to_mhc_fwd(x: torch.Tensor, o: torch.Tensor, *, target: str | None = None,
                      flavor: str | None = None) -> torch.Tensor:
    """Copy the hidden state ``x`` into each of the ``n`` streams of ``o``: ``o[t, m, h] = x[t, h]``.

    A bit copy: every value, NaN payloads and signed zeros included, arrives unchanged in every
    stream. ``n`` is ``o.size(1)``. With no tokens nothing runs.

    Args:
        x: The hidden state, contiguous bf16 ``(T, H)``, ``H >= 1``.
        o: The output, contiguous bf16 ``(T, n, H)`` with ``1 <= n <= 16``, on x's device; it is
            overwritten (and returned) and must not share memory with ``x``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``). Both flavors give the same bits.

    Returns:
        ``o``, written.

    Raises:
        TypeError: ``x`` or ``o`` is not a tensor or not bf16.
        ValueError: ``x`` is not 2-D or not contiguous or has no hidden column; ``o`` is not 3-D,
            has a stream count outside ``[1, 16]``, a shape other than ``(T, n, H)``, is not
            contiguous, is on another device or shares memory with ``x``; a tensor is too large
            for 32-bit kernel offsets.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and ``o`` requires grad.
    """
    if not isinstance(o, torch.Tensor):
        raise TypeError(f"o must be a torch.Tensor, got {type(o).__name__}")
    if o.dim() != 3:
        raise ValueError(f"o must be 3-D (tokens, streams, hidden), got shape {tuple(o.shape)}")
    return EXPAND_TO_MHC_FWD(x, o.shape[1], out=(o,), target=target, flavor=flavor)


expand_to_mhc_fwd_parallel = parallel_entry(expand_to_mhc_fwd, "x")


def expand_to_mhc_bwd(o_grad: torch.Tensor, x_grad: torch.Tensor, *, target: str | None = None,
                      flavor: str | None = None) -> torch.Tensor:
    """The gradient of ``expand_to_mhc_fwd``: ``x_grad = bf16(Σ_m f32(o_grad[:, m]))``.

    The fp32 sum starts from stream 0 and adds streams ``1 .. n-1`` in order; it is rounded to
    bf16 once (nearest, ties to even), so ``1 + 3 · 2^-8`` gives 1.015625, not 1.0. Both flavors
    give the same bits (also the sign of an all-zero sum: -0 only when every stream holds -0).
    Non-finite values follow IEEE arithmetic: a NaN in a column makes it NaN, +inf and -inf
    together give NaN, and a finite sum above the bf16 range rounds to ±inf.

    Args:
        o_grad: The gradient of ``o``, contiguous bf16 ``(T, n, H)``, ``1 <= n <= 16``, ``H >= 1``.
        x_grad: The output, contiguous bf16 ``(T, H)`` on o_grad's device; it is overwritten
            (and returned) and must not share memory with ``o_grad``.
        target: As for ``expand_to_mhc_fwd`` (the device of o_grad decides the default).
        flavor: As for ``expand_to_mhc_fwd``.

    Returns:
        ``x_grad``, written.

    Raises:
        TypeError: ``o_grad`` or ``x_grad`` is not a tensor or not bf16.
        ValueError: ``o_grad`` is not 3-D or not contiguous, has a stream count outside
            ``[1, 16]`` or no hidden column; ``x_grad`` has a shape other than ``(T, H)``, is not
            contiguous, is on another device or shares memory with ``o_grad``; a tensor is too
            large for 32-bit kernel offsets.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and ``x_grad`` requires grad.
    """
    if not isinstance(x_grad, torch.Tensor):
        raise TypeError(f"x_grad must be a torch.Tensor, got {type(x_grad).__name__}")
    return EXPAND_TO_MHC_BWD(o_grad, out=(x_grad,), target=target, flavor=flavor)


expand_to_mhc_bwd_parallel = parallel_entry(expand_to_mhc_bwd, "o_grad")
