"""PyTorch reference of ``norm_backward``, the RMSNorm backward (spec quant-b §5.2).

Per row, every step one fp32 operation (one RNE rounding; no fused multiply-add):

* ``xh = f32(x) · rstd``, ``d = f32(out_grad) · f32(out_scale)``, ``g = d · f32(weight)``
  (``g = d`` without a weight);
* ``dot = Σ xh · g`` in vmi's fixed lane order (``vmi_core.sums.lane_sum``: the products rounded,
  then 64 per-lane partials and a pairwise fold);
* ``m = dot · f32(1 / H)`` (``ascend`` flavor) or ``dot / H`` (``cuda`` flavor);
* ``dx = (g − xh · m) · rstd``, then ``+ f32(residual_out_grad)``; ``x_grad`` = ``dx`` rounded
  to x's dtype.

The weight gradient ``dW_i = Σ_rows xh_i · d_i`` is summed in the kernels' order: the rows'
rounded products go to one partial sum per block of ``row_block`` consecutive rows (32 in the
kernels), each from +0.0 with its rows in increasing order; the partials are added in block order
to +0.0, then ``f32(weight_grad)`` when accumulating, and the result is rounded to
``weight_grad``'s dtype.

fp32 tensors of torch do every ``* + - /`` above with one correct rounding; bf16 outputs go
through ``vmi_core.formats.bf16_encode`` (RNE, a NaN keeps its sign), as the kernels round.
"""

from __future__ import annotations

import torch

from vmi_core.formats import bf16_decode, bf16_encode
from vmi_core.sums import lane_sum
from vmi_core.targets import Flavor, get_flavor


def _to_f32(t: torch.Tensor) -> torch.Tensor:
    return bf16_decode(t.view(torch.int16)) if t.dtype == torch.bfloat16 else t.float()


def _round_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return bf16_encode(values).view(torch.bfloat16)
    return values.clone()


def block_partial_sums(terms: torch.Tensor, row_block: int) -> torch.Tensor:
    """``(ceil(T / row_block), H)`` fp32: partial ``b`` = +0.0, then ``+ terms[r]`` for the rows
    ``r`` of block ``b`` (``b · row_block <= r < (b + 1) · row_block``) in increasing order,
    every addition rounded."""
    rows, hidden = terms.shape
    blocks = -(-rows // row_block)
    # Rows past T add +0.0: the sums start at +0.0 and never become -0.0, so that changes nothing.
    padded = torch.zeros(blocks * row_block, hidden, dtype=torch.float32)
    padded[:rows] = terms
    padded = padded.view(blocks, row_block, hidden)
    sums = torch.zeros(blocks, hidden, dtype=torch.float32)
    for k in range(row_block):
        sums = sums + padded[:, k]
    return sums


def norm_backward(out_grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                  residual_out_grad: torch.Tensor | None = None, out_scale: float = 1.0,
                  weight_grad: torch.Tensor | None = None, *, row_block: int = 32,
                  flavor: str | Flavor = "ascend"
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(x_grad, weight_grad)`` of the module docstring, on cpu tensors.

    ``weight_grad`` (with a weight): the buffer the gradient is added to (not written; the
    result is a new tensor of its dtype), or None for a new x-dtype gradient. ``row_block``:
    rows per partial sum of the weight gradient.
    """
    flavor = get_flavor(flavor)
    rows, hidden = x.shape
    if rows == 0:
        new = None if weight is None else torch.zeros(hidden, dtype=x.dtype)
        return torch.empty(0, hidden, dtype=x.dtype), new if weight_grad is None else weight_grad.clone()
    xh = _to_f32(x) * rstd[:, None]
    d = _to_f32(out_grad) * torch.tensor(out_scale, dtype=torch.float32)
    g = d if weight is None else d * _to_f32(weight)
    dot = lane_sum(xh * g)[:, None]
    if flavor.name == "ascend":
        m = dot * torch.tensor(1.0 / hidden, dtype=torch.float32)
    else:
        m = dot / torch.tensor(float(hidden), dtype=torch.float32)
    dx = (g - xh * m) * rstd[:, None]
    if residual_out_grad is not None:
        dx = dx + _to_f32(residual_out_grad)
    x_grad = _round_to(dx, x.dtype)
    if weight is None:
        return x_grad, None
    total = torch.zeros(hidden, dtype=torch.float32)
    for partial in block_partial_sums(xh * d, row_block):
        total = total + partial
    if weight_grad is not None:
        total = total + _to_f32(weight_grad)
    return x_grad, _round_to(total, x.dtype if weight_grad is None else weight_grad.dtype)
