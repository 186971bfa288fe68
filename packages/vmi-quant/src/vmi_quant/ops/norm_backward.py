"""``norm_backward``: public dispatch of the RMSNorm backward (validation, allocation, backend choice).

Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_float, check_in_place, check_kernel_extent, check_tensor, mark_written
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import compare_named, randn

from .. import reference
from ..inputs import PLAIN_DTYPES, check_matrix, check_same_device
from ..kernels import norm_backward as parallel
from . import demo


@dataclass
class NormBackwardCall:
    """A validated call: the row kernel's specialisation and the tensors the kernels read and write."""

    spec: parallel.NormBackwardSpec
    out_grad: torch.Tensor
    x: torch.Tensor
    weight: torch.Tensor | None
    rstd: torch.Tensor
    residual_out_grad: torch.Tensor | None
    weight_grad: torch.Tensor | None
    x_grad: torch.Tensor
    flavor: Flavor


def _check_like_x(t, name: str, x: torch.Tensor) -> None:
    check_matrix(t, name)
    if t.dtype != x.dtype:
        raise TypeError(f"{name} must have x's dtype {x.dtype}, got {t.dtype}")
    if t.shape != x.shape:
        raise ValueError(f"{name} must have x's shape {tuple(x.shape)}, got {tuple(t.shape)}")
    check_same_device(t, name, x.device)


def _prepare(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad, target, flavor
             ) -> tuple[str, NormBackwardCall]:
    check_matrix(x, "x")
    if x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    num_rows, hidden = x.shape
    if hidden % parallel.ALIGN or not 0 < hidden <= parallel.MAX_HIDDEN:
        raise ValueError(f"the hidden size of x must be a positive multiple of {parallel.ALIGN} up to "
                         f"{parallel.MAX_HIDDEN}, got {hidden}")
    _check_like_x(out_grad, "out_grad", x)
    if residual_out_grad is not None:
        _check_like_x(residual_out_grad, "residual_out_grad", x)
    check_tensor(rstd, "rstd", dtype=torch.float32, shape=(num_rows,), contiguous=True)
    check_same_device(rstd, "rstd", x.device)
    if weight is not None:
        check_tensor(weight, "weight", dtype=x.dtype, shape=(hidden,), contiguous=True)
        check_same_device(weight, "weight", x.device)
    if weight_grad is not None:
        if weight is None:
            raise ValueError("weight_grad needs a weight: without one there is no weight gradient")
        check_tensor(weight_grad, "weight_grad", dtype=tuple(PLAIN_DTYPES), shape=(hidden,), contiguous=True)
        check_same_device(weight_grad, "weight_grad", x.device)
        check_kernel_extent(weight_grad, "weight_grad")
        check_in_place(weight_grad, "weight_grad", "norm_backward")
        check_disjoint({"weight_grad": weight_grad},
                       {"out_grad": out_grad, "x": x, "weight": weight, "rstd": rstd,
                        "residual_out_grad": residual_out_grad})
    out_scale = check_float(out_scale, "out_scale", finite=True)
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    spec = parallel.NormBackwardSpec(PLAIN_DTYPES[x.dtype], hidden, weight is not None,
                                     residual_out_grad is not None, out_scale, flavor.name)
    x_grad = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
    return target, NormBackwardCall(spec, out_grad, x, weight, rstd, residual_out_grad, weight_grad, x_grad, flavor)


def _reference(call: NormBackwardCall) -> None:
    x_grad, weight_grad = reference.norm_backward(
        call.out_grad, call.x, call.weight, call.rstd, call.residual_out_grad, call.spec.out_scale, call.weight_grad,
        flavor=call.flavor)
    call.x_grad.copy_(x_grad)
    if weight_grad is not None:
        call.weight_grad.copy_(weight_grad)


def _run(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad, *, out, target, flavor, launch):
    target, call = _prepare(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad, target, flavor)
    if launch and target == "torch":
        _reference(call)
    elif launch:
        parallel.launch(call, target)
        if weight_grad is not None and x.shape[0]:
            mark_written(weight_grad)
    return call.x_grad


_OPTIONS = (
    Option("in_dtype", "bf16", tuple(demo.IN_DTYPES), "dtype of x, out_grad and the weight"),
    Option("weight_grad_dtype", "fp32", tuple(demo.IN_DTYPES), "dtype of the accumulated weight gradient"),
    Option("with_residual_grad", False, help="add a residual_out_grad"),
    Option("scaled", False, help="out_scale 0.3 (else 1.0)"),
)
_DEFAULT_SHAPE = (1024, 4096)
_EPS = 1e-6


def _inputs(shape, options, seed):
    dtype = demo.IN_DTYPES[options["in_dtype"]]
    rows, hidden = shape
    x = randn(shape, seed, dtype)
    inputs = {
        "out_grad": randn(shape, seed + 1, dtype),
        "x": x,
        "weight": randn((hidden,), seed + 2, dtype),
        # The forward's saved rstd.
        "rstd": torch.rsqrt(x.float().square().mean(-1) + _EPS),
        "weight_grad": randn((hidden,), seed + 3, demo.IN_DTYPES[options["weight_grad_dtype"]]),
    }
    if options["with_residual_grad"]:
        inputs["residual_out_grad"] = randn(shape, seed + 4, dtype)
    return inputs


def _out_scale(options) -> float:
    return 0.3 if options["scaled"] else 1.0


def _kernels(options, target, flavor):
    # The kernels are specialised on the hidden size: that of the default shape. With a weight
    # (always, here) the row kernel's partial sums are reduced into weight_grad by a second one.
    hidden = _DEFAULT_SHAPE[1]
    spec = parallel.NormBackwardSpec(options["in_dtype"], hidden, True, options["with_residual_grad"],
                                     _out_scale(options), resolve_flavor(target, flavor).name)
    reduce_spec = parallel.WeightGradReduceSpec(hidden, options["weight_grad_dtype"])
    return [(parallel.build_norm_backward, spec), (parallel.build_weight_grad_reduce, reduce_spec)]


NORM_BACKWARD = KernelOp(
    "norm_backward",
    (Param("out_grad", "Tensor"), Param("x", "Tensor"), Param("weight", "Tensor", optional=True),
     Param("rstd", "Tensor"), Param("residual_out_grad", "Tensor", None, optional=True),
     Param("out_scale", "float", 1.0), Param("weight_grad", "Tensor", None, optional=True, mutable=True)),
    ("x_grad",), _run,
    command=Command(
        summary="RMSNorm backward: x_grad, and the weight gradient accumulated into a bf16/fp32 buffer "
                "(deterministic partial sums)",
        support=support(cpu="bit-exact against the reference in both flavors, with and without weight"),
        default_shape=_DEFAULT_SHAPE, bench_shapes=((8001, 7168), (4096, 4096), (1024, 4096), (16, 7168)),
        make_inputs=_inputs, kernels=_kernels, options=_OPTIONS,
        arguments=lambda inputs, options, flavor: {"out_scale": _out_scale(options)},
        check=compare_named(("x_grad", "weight_grad"))))


def norm_backward(out_grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                  residual_out_grad: torch.Tensor | None = None, out_scale: float = 1.0,
                  weight_grad: torch.Tensor | None = None, *, target: str | None = None,
                  flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of RMSNorm ``y = x · rstd · w · out_scale`` with respect to ``x`` and ``w``.

    Per row (every step one fp32 operation rounded to nearest even; no fused multiply-add):
    ``xh = f32(x) · rstd``, ``d = f32(out_grad) · f32(out_scale)``, ``g = d · f32(w)`` (``d``
    without a weight), ``dot = Σ xh · g`` (the rounded products summed in vmi's fixed lane order:
    ``vmi_core.sums.lane_sum``), ``m = dot · f32(1/H)`` (``ascend`` flavor) or ``dot / H``
    (``cuda`` flavor), ``dx = (g − xh · m) · rstd``, then ``+ f32(residual_out_grad)``;
    ``x_grad`` is ``dx`` rounded to x's dtype. ``rstd`` is used as given (the forward's, not
    recomputed); with a forward residual, the residual's gradient equals ``x_grad``.

    The weight gradient ``Σ_rows xh · d`` is summed in an order that depends on ``T`` only, so
    every target, worker count and thread count gives the same bits: the rows' rounded products
    go to one fp32 partial sum per block of 32 consecutive rows (from +0.0, rows in increasing
    order), the partials are added in block order from +0.0, then the buffer's value
    ``f32(weight_grad)``, and the sum is rounded to the buffer's dtype.

    Non-finite values propagate as in IEEE arithmetic: a NaN or ±inf in a row of ``x``,
    ``out_grad`` or ``rstd`` makes that row's ``dot``, hence its ``x_grad``, NaN or ±inf, and
    reaches the weight gradient of the columns whose products it enters; ``residual_out_grad``
    only enters its own element. The sign and payload of a NaN output are not specified.

    Args:
        out_grad: Gradient of the forward output, x's shape, dtype and device, unit stride along
            ``H`` (the row stride is free).
        x: The forward's pre-normalisation input (``norm_input``): bf16/fp32 ``(T, H)``, ``H`` a
            multiple of 32 in ``[32, 8192]``, unit stride along ``H``, rows not overlapping.
        weight: The forward's weight, ``(H,)`` of x's dtype, contiguous; or None (unit weight,
            no weight gradient).
        rstd: The forward's fp32 ``(T,)`` reciprocal RMS, contiguous.
        residual_out_grad: Optional gradient of the forward's residual output, added to
            ``x_grad``; as ``out_grad``.
        out_scale: The forward's output multiplier (a finite real number).
        weight_grad: Optional bf16/fp32 ``(H,)`` contiguous buffer (needs ``weight``); the weight
            gradient is added to it in place and it is returned. It must not share memory with
            an input.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        x_grad: A new contiguous ``(T, H)`` tensor of x's dtype.
        weight_grad: None without a weight; the given ``weight_grad`` (updated in place); else
            a new ``(H,)`` tensor of x's dtype (zeros when ``T == 0``). The torch custom op
            ``torch.ops.vmi.norm_backward`` returns ``x_grad`` and takes the new buffer zeroed:
            adding the gradient to zeros gives the same bits as storing it.

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype (``x`` bf16/fp32;
            ``out_grad``, ``residual_out_grad`` and ``weight`` x's dtype; ``rstd`` fp32;
            ``weight_grad`` bf16/fp32); ``out_scale`` is not a real number.
        ValueError: ``x`` is not 2-D, has a non-unit stride along ``H``, overlapping rows or a
            hidden size outside the supported ones, or is too large for 32-bit kernel offsets;
            another tensor has the wrong shape, strides or device; ``out_scale`` is not finite;
            ``weight_grad`` is given without ``weight`` or shares memory with an input.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and ``weight_grad`` requires grad.
    """
    if weight is not None and weight_grad is None and isinstance(x, torch.Tensor):
        weight_grad = torch.zeros(weight.shape if isinstance(weight, torch.Tensor) else x.shape[-1:],
                                  dtype=x.dtype, device=x.device)
    x_grad = NORM_BACKWARD(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad, target=target,
                           flavor=flavor)
    return x_grad, weight_grad


norm_backward_parallel = parallel_entry(norm_backward, "x")
