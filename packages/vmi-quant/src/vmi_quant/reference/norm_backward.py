"""PyTorch reference of ``norm_backward``, the RMSNorm backward (spec quant-b §5.2).

Per row, every step one fp32 operation (one RNE rounding; no fused multiply-add):

* ``xh = f32(x) · rstd``, ``d = f32(out_grad) · f32(out_scale)``, ``g = d · f32(weight)``
  (``g = d`` without a weight);
* ``dot = Σ xh · g`` in vmi's fixed lane order (``vmi_core.sums.lane_sum``: the products rounded,
  then 64 per-lane partials and a pairwise fold);
* ``m = dot · f32(1 / H)`` (``ascend`` flavor) or ``dot / H`` (``cuda`` flavor);
* ``dx = (g − xh · m) · rstd``, then ``+ f32(residual_out_grad)``; ``x_grad`` = ``dx`` rounded
  to x's dtype.

The weight gradient ``dW_i = Σ_rows xh_i · d_i`` is summed in the kernel's order: the rows are
dealt to ``num_partials`` partial sums (``row_partials[r]`` names the partial of row ``r``), each
partial starts at +0.0 and adds the rounded products of its rows in increasing row order, then the
partials are added in order ``0 .. P-1`` to +0.0, then ``f32(weight_grad)`` when accumulating,
and the result is rounded to ``weight_grad``'s dtype.

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


def partial_sums(terms: torch.Tensor, row_partials: torch.Tensor, num_partials: int) -> torch.Tensor:
    """``(num_partials, H)`` fp32: partial ``p`` = +0.0, then ``+ terms[r]`` for the rows ``r`` with
    ``row_partials[r] == p`` in increasing order, every addition rounded."""
    rows, hidden = terms.shape
    sums = torch.zeros(num_partials, hidden, dtype=torch.float32)
    if rows == 0:
        return sums
    order = torch.argsort(row_partials * rows + torch.arange(rows), stable=True)
    partial_of = row_partials[order]
    counts = torch.bincount(row_partials, minlength=num_partials)
    starts = torch.cumsum(counts, 0) - counts
    # Step k adds the k-th row of every partial that has one (a +0.0 for the others: the sums
    # start at +0.0 and never become -0.0, so that addition changes nothing).
    position = torch.arange(rows) - starts[partial_of]
    slots = torch.full((num_partials, int(counts.max())), rows, dtype=torch.int64)
    slots[partial_of, position] = order
    padded = torch.cat([terms, torch.zeros(1, hidden, dtype=torch.float32)])
    for k in range(slots.shape[1]):
        sums += padded[slots[:, k]]
    return sums


def norm_backward(out_grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                  residual_out_grad: torch.Tensor | None = None, out_scale: float = 1.0,
                  weight_grad: torch.Tensor | None = None, *, row_partials: torch.Tensor | None = None,
                  num_partials: int = 1, flavor: str | Flavor = "ascend"
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(x_grad, weight_grad)`` of the module docstring, on cpu tensors.

    ``weight_grad`` (with a weight): the buffer the gradient is added to (not written; the
    result is a new tensor of its dtype), or None for a new x-dtype gradient. ``row_partials``:
    int64 ``(T,)`` partial index of every row (default: one partial, all rows in order).
    """
    flavor = get_flavor(flavor)
    rows, hidden = x.shape
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
    if rows == 0 and weight_grad is not None:
        return x_grad, weight_grad.clone()
    if row_partials is None:
        row_partials = torch.zeros(rows, dtype=torch.int64)
    partials = partial_sums(xh * d, row_partials.to(torch.int64), num_partials)
    total = torch.zeros(hidden, dtype=torch.float32)
    for p in range(num_partials):
        total = total + partials[p]
    if weight_grad is not None:
        total = total + _to_f32(weight_grad)
    return x_grad, _round_to(total, x.dtype if weight_grad is None else weight_grad.dtype)
