"""Autograd for the RMSNorm and SwiGLU kernels: ``torch.autograd.Function``s pairing a forward
kernel with its backward kernel.

* ``RMSNormFunction``: ``norm_forward`` (or, with ``cast``, ``norm_forward_and_per_token_cast``)
  forward and ``norm_backward`` backward; differentiable in ``x``, ``weight`` and ``residual``.
  With a residual the sum ``x + residual`` is an output too, and its gradient joins the
  backward kernel's ``residual_out_grad``.
* ``SwiGLUFunction``: ``swiglu_forward`` forward and ``swiglu_backward`` backward;
  differentiable in ``x`` and ``topk_weights``.

The FP8 variant of RMSNorm returns its quantized output ``(data, sf)`` as non-differentiable
outputs beside the differentiable bf16 copy of the normalised output (``with_out_bf16``), whose
gradient the backward takes. SwiGLU's FP8 forward writes only the FP8 data and scales, so it has
no differentiable output to pair: a training step that quantizes the SwiGLU output calls
``swiglu_forward_and_per_token_cast`` and feeds the activation gradient to ``swiglu_backward`` (or
``swiglu_backward_and_per_token_cast``) itself.

Nothing of a forward pass is saved but its inputs and, for RMSNorm, the fp32 ``rstd``: the backward
kernels recompute the rest, as TileKernels' do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.autograd import first_order

from .config import get_token_alignment
from .inputs import PLAIN_DTYPES
from .ops.norm_backward import norm_backward
from .ops.norm_forward import norm_forward, norm_forward_and_per_token_cast
from .ops.swiglu_backward import swiglu_backward
from .ops.swiglu_forward import swiglu_forward


@dataclass(frozen=True)
class NormCastOptions:
    """The per-token FP8 cast of ``RMSNormFunction``'s output: ``norm_forward_and_per_token_cast``'s
    options of the same names."""

    fmt: str = "e4m3"
    num_per_channels: int = 32
    use_tma_aligned_col_major_sf: bool = False
    round_sf: bool = False
    use_packed_ue8m0: bool = False


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm with the vmi kernels forward and backward.

    ``RMSNormFunction.apply(x, weight, residual, eps, out_scale, cast[, target, flavor])`` returns
    ``(out, residual_out, data, sf)``:

    * ``out``: the normalised output, differentiable: x's dtype, or with ``cast`` its bf16 copy;
    * ``residual_out``: ``x + residual`` rounded to x's dtype (None without a residual);
    * ``data, sf``: with ``cast`` (a ``NormCastOptions``), the FP8 output and its scales, not
      differentiable; else None.

    ``weight`` and ``residual`` may be None; ``eps``, ``out_scale`` and ``cast`` are constants, and
    so are the optional ``target`` and ``flavor``, passed to the forward and the backward kernel as
    the ops take them (None: the ops' defaults). The backward runs ``norm_backward`` on the saved
    normalised input and ``rstd``; a residual's gradient is x's.
    """

    @staticmethod
    def forward(ctx, x, weight, residual, eps, out_scale, cast, target=None, flavor=None):
        data = sf = None
        if cast is None:
            out, rstd, norm_input = norm_forward(x, weight, eps, residual, out_scale, target=target, flavor=flavor)
        else:
            (data, sf), out, rstd, norm_input = norm_forward_and_per_token_cast(
                x, weight, eps, cast.fmt, cast.num_per_channels, residual, out_scale,
                cast.use_tma_aligned_col_major_sf, cast.round_sf, cast.use_packed_ue8m0, with_out_bf16=True,
                target=target, flavor=flavor)
            ctx.mark_non_differentiable(data, sf)
        ctx.save_for_backward(norm_input, weight, rstd)
        ctx.out_scale, ctx.target, ctx.flavor = out_scale, target, flavor
        residual_out = None if residual is None else norm_input
        return out, residual_out, data, sf

    @staticmethod
    @first_order
    def backward(ctx, out_grad, residual_out_grad, _data_grad, _sf_grad):
        norm_input, weight, rstd = ctx.saved_tensors
        shape, hidden = norm_input.shape, norm_input.shape[-1]
        rows = norm_input.reshape(-1, hidden)
        # Gradients may come broadcast (``out.sum().backward()``): the kernel reads dense rows.
        if out_grad is None:
            out_grad = torch.zeros_like(rows)
        out_grad = out_grad.to(norm_input.dtype).reshape(-1, hidden).contiguous()
        if residual_out_grad is not None:
            residual_out_grad = residual_out_grad.reshape(-1, hidden).contiguous()
        x_grad, weight_grad = norm_backward(out_grad, rows, weight, rstd.reshape(-1), residual_out_grad,
                                            ctx.out_scale, target=ctx.target, flavor=ctx.flavor)
        x_grad = x_grad.view(shape)
        needs_x, needs_weight, needs_residual = ctx.needs_input_grad[:3]
        return (x_grad if needs_x else None, weight_grad if needs_weight else None,
                x_grad if needs_residual else None, None, None, None, None, None)


class SwiGLUFunction(torch.autograd.Function):
    """SwiGLU of MoE expert rows with the vmi kernels forward and backward.

    ``SwiGLUFunction.apply(x, topk_weights, psum_num_tokens_per_expert, routed_scaling_factor,
    clamp_value)`` returns ``swiglu_forward(x, fmt)`` with ``fmt`` x's own (``"bf16"`` or
    ``"fp32"``), differentiable in ``x`` and ``topk_weights`` (which may be None; the others are
    constants). Padding rows of the psum layout are zeros in the output and get a zero gradient.
    The backward runs ``swiglu_backward`` on the saved ``x`` (the gradient of a clamped input is
    0) with the forward's token alignment: a different one set in between raises ``ValueError``.
    """

    @staticmethod
    def forward(ctx, x, topk_weights, psum_num_tokens_per_expert, routed_scaling_factor, clamp_value):
        fmt = PLAIN_DTYPES.get(x.dtype, str(x.dtype))
        out = swiglu_forward(x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value)
        ctx.save_for_backward(x, topk_weights, psum_num_tokens_per_expert)
        ctx.fmt, ctx.routed_scaling_factor, ctx.clamp_value = fmt, routed_scaling_factor, clamp_value
        ctx.alignment = get_token_alignment()
        return out

    @staticmethod
    @first_order
    def backward(ctx, out_grad):
        x, topk_weights, psum = ctx.saved_tensors
        # swiglu_backward reads the process-wide alignment: it must place the rows as the forward did.
        if psum is not None and get_token_alignment() != ctx.alignment:
            raise ValueError(f"SwiGLUFunction: the token alignment changed between forward ({ctx.alignment}) and "
                             f"backward ({get_token_alignment()}); the psum layout's padding rows would move")
        grads = swiglu_backward(x, out_grad.to(x.dtype).contiguous(), ctx.fmt, psum, topk_weights,
                                ctx.routed_scaling_factor, ctx.clamp_value)
        x_grad = grads[0]
        weight_grad = grads[1] if topk_weights is not None and ctx.needs_input_grad[1] else None
        return x_grad if ctx.needs_input_grad[0] else None, weight_grad, None, None, None
