"""Reference of ``pre_apply_mix`` (spec §3.6; §5.2): the weighted sum of a token's streams.

Forward, per flavor (``vmi_mhc.tl.mix`` is the kernel side of the same chain)::

    ascend:  acc = mix[0] · x[0];  acc = fma(mix[m], x[m], acc)  for m = 1 .. n-1
    cuda:    acc = +0;             acc = fma(mix[m], x[m], acc)  for m = 0 .. n-1
    o = bf16(acc)                                     (nearest, ties to even)

Backward (both flavors)::

    x_grad[m]  = bf16(fma(mix[m], f32(o_grad), f32(x_grad[m])))      accumulated into x_grad
    mix_grad[m] = Σ_h f32(o_grad) · f32(x[m])    in vmi's fixed 64-lane order, each product fused
                                                 into its partial (vmi_core.sums.lane_sum_fused)

The ``*_exact`` functions evaluate the same formulas in float64 without intermediate rounding,
to measure the kernels' error against.
"""

from __future__ import annotations

import torch

from vmi_core.formats import bf16_encode
from vmi_core.fp32 import fma
from vmi_core.sums import lane_sum_fused


def _to_bf16(values: torch.Tensor) -> torch.Tensor:
    return bf16_encode(values).view(torch.bfloat16)


def stream_mix(flavor: str, mix: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """fp32 ``Σ_m mix[:, m] · x[:, m]`` of fp32 ``mix (T, n)`` and ``x (T, n, H)`` in ``flavor``'s chain."""
    weights = mix.unsqueeze(-1)
    if flavor == "ascend":
        acc, first = x[:, 0] * weights[:, 0], 1
    elif flavor == "cuda":
        acc, first = torch.zeros_like(x[:, 0]), 0
    else:
        raise ValueError(f"flavor must be 'ascend' or 'cuda', got {flavor!r}")
    for m in range(first, x.shape[1]):
        acc = fma(weights[:, m], x[:, m], acc)
    return acc


def mhc_pre_apply_mix_fwd(x: torch.Tensor, mix: torch.Tensor, flavor: str) -> torch.Tensor:
    """``o`` (bf16 ``(T, H)``) of bf16 streams ``x (T, n, H)`` and fp32 weights ``mix (T, n)``."""
    return _to_bf16(stream_mix(flavor, mix.float(), x.float()))


def mhc_pre_apply_mix_bwd(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor,
                          x_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_grad + mix · o_grad, mix_grad)``: the new bf16 ``(T, n, H)`` stream gradients (the given
    ``x_grad`` is not modified) and the fp32 ``(T, n)`` weight gradients."""
    og = o_grad.float().unsqueeze(1).expand(x.shape)
    new_x_grad = _to_bf16(fma(mix.float().unsqueeze(-1), og, x_grad.float()))
    mix_grad = lane_sum_fused(og.contiguous(), x.float())
    return new_x_grad, mix_grad


def mhc_pre_apply_mix_fwd_exact(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """float64 ``Σ_m mix[:, m] · x[:, m]``."""
    return (mix.double().unsqueeze(-1) * x.double()).sum(dim=1)


def mhc_pre_apply_mix_bwd_exact(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor,
                                x_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(x_grad + mix · o_grad, Σ_h o_grad · x)``."""
    og = o_grad.double().unsqueeze(1)
    return x_grad.double() + mix.double().unsqueeze(-1) * og, (og * x.double()).sum(dim=-1)
