"""PyTorch reference of the SwiGLU backward (spec quant-b §7.2), in both flavors.

Every step is one fp32 torch operation (each correctly rounded) in the spec's order; ``exp`` is
the correctly rounded ``vmi_core.fp32.exp`` (torch's float32 ``exp`` is not), the fused
multiply-add of the ``cuda`` flavor ``vmi_core.fp32.fma`` and the weight-gradient sum vmi's
fixed lane order ``vmi_core.sums.lane_sum_fused``. Where the flavors differ:

* ``inner = 1 + a'(1 - s)``: ``cuda`` fuses it, ``fma(a', 1 - s, 1)``; ``ascend`` rounds the
  product and the sum separately, ``f32(1 + f32(a' · f32(1 - s)))``.
* the two divisions ``s = 1 / den`` and ``a' / den``: ``cuda`` divides in IEEE fp32; ``ascend``
  models the vector unit's division (``vmi_core.fp32.divide``), which flushes subnormal operands
  and quotients to zero (sign kept) and corrects quotients below about 2^-100 by a residual check. The clamp,
  the divisions and the row weights are the forward reference's (``reference.swiglu_forward``).

Rows that are not valid (psum padding, see ``vmi_quant.inputs.expert_rows``) are written as +0
(x_grad, act_out, weight_grad), FP8 data 0 and SF 0, whatever they hold.
"""

from __future__ import annotations

import torch

from vmi_core.formats import e4m3_decode
from vmi_core.fp32 import divide, exp, fma
from vmi_core.sums import lane_sum_fused
from vmi_core.targets import Flavor, get_flavor

from .cast import cast
from .swiglu_forward import clamp_gate_up, row_weights


def dequantize_halves(x, num_per_channels: int | None):
    """``(a, b)``: the fp32 gate and up halves of ``x`` (bf16/fp32 ``(N, 2H)`` or an E4M3
    ``(data, sf)`` pair with an fp32 row-major ``(N, 2H / npc)`` SF, ``f32(data) · sf``)."""
    if isinstance(x, tuple):
        data, sf = x
        values = e4m3_decode(data.contiguous().view(torch.uint8))
        values = values * sf.float().repeat_interleave(num_per_channels, dim=1)
    else:
        values = x.float()
    hidden = values.shape[1] // 2
    return values[:, :hidden], values[:, hidden:]


def swiglu_backward(a: torch.Tensor, b: torch.Tensor, act_x_grad: torch.Tensor, valid: torch.Tensor,
                    topk_weights: torch.Tensor | None = None, routed_scaling_factor: float | None = None,
                    clamp_value: float | None = None, flavor: str | Flavor = "ascend"):
    """The fp32 results of §7.2: ``(dA, dB, act_out, weight_grad)``.

    ``a``, ``b``: fp32 ``(N, H)`` gate and up inputs; ``act_x_grad`` bf16/fp32 ``(N, H)``;
    ``valid`` bool ``(N,)``. ``weight_grad`` is None without ``topk_weights``. Invalid rows are +0.
    """
    flavor = get_flavor(flavor)
    g = act_x_grad.float()
    a_c, b_c = clamp_gate_up(a, b, clamp_value)
    if clamp_value is not None:
        c = torch.tensor(clamp_value, dtype=torch.float32)
        clamped_a, clamped_b = a > c, (b > c) | (b < -c)
    else:
        clamped_a = clamped_b = torch.zeros_like(a, dtype=torch.bool)
    one = torch.ones_like(a)
    den = one + exp(-a_c)
    s = divide(one, den, flavor)
    act = divide(a_c, den, flavor) * b_c
    row_valid = valid[:, None]
    weights = row_weights(topk_weights, routed_scaling_factor)
    if weights is None:
        w = row_valid.float()
    else:
        w = torch.where(valid, weights.float(), torch.zeros_like(weights.float()))[:, None]
    gws = (g * w) * s
    one_minus_s = one - s
    if flavor.name == "cuda":
        inner = fma(a_c, one_minus_s, one)
    else:
        inner = one + a_c * one_minus_s
    zero = torch.zeros_like(a)
    d_a = torch.where(clamped_a, zero, (gws * b_c) * inner)
    d_b = torch.where(clamped_b, zero, gws * a_c)
    act_out = act * w
    d_a, d_b, act_out = (torch.where(row_valid, t, zero) for t in (d_a, d_b, act_out))
    weight_grad = None
    if topk_weights is not None:
        # (The lane sum of no rows is no sums.)
        weight_grad = lane_sum_fused(g, act) if g.shape[0] else torch.zeros(0)
        if routed_scaling_factor is not None:
            weight_grad = weight_grad * torch.tensor(routed_scaling_factor, dtype=torch.float32)
        weight_grad = torch.where(valid, weight_grad, torch.zeros_like(weight_grad))
    return d_a, d_b, act_out, weight_grad


def quantize_grad(x_grad: torch.Tensor, valid: torch.Tensor, num_per_channels: int, round_sf: bool = False,
                  use_tma_aligned_col_major_sf: bool = False, use_packed_ue8m0: bool = False,
                  flavor: str | Flavor = "ascend") -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 gradient of §7.2: the fp32 ``(N, 2H)`` ``x_grad`` cast per token in groups of
    ``num_per_channels`` (``vmi_quant.reference.cast``), invalid rows' data and SF set to 0."""
    data, sf = cast(x_grad, "e4m3", (1, num_per_channels), round_sf=round_sf,
                    use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, use_packed_ue8m0=use_packed_ue8m0,
                    flavor=flavor)
    invalid = ~valid
    data.view(torch.uint8)[invalid] = 0
    sf[invalid] = 0
    return data, sf
