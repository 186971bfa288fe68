"""Reference of ``expand`` (spec §3.1): widen a hidden state into ``n`` residual streams.

Forward: ``o[t, m, h] = x[t, h]`` for every stream ``m`` (a bit copy). Backward:
``x_grad[t, h] = bf16(Σ_m f32(o_grad[t, m, h]))``, the fp32 sum starting from stream 0 and adding
streams 1 .. n-1 in order, rounded to bf16 once (nearest, ties to even). Both flavors compute the
same bits.
"""

from __future__ import annotations

import torch

from vmi_core.formats import bf16_encode


def expand_to_mhc_fwd(x: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """``(T, mhc_mult, H)``: every stream a copy of the ``(T, H)`` hidden state ``x``."""
    return x.unsqueeze(-2).expand(*x.shape[:-1], mhc_mult, x.shape[-1]).contiguous()


def stream_sum(o_grad: torch.Tensor) -> torch.Tensor:
    """fp32 ``Σ_m o_grad[:, m]`` of ``(T, n, H)``: stream 0, then each next stream added in order."""
    total = o_grad[:, 0].float()
    for m in range(1, o_grad.shape[1]):
        total = total + o_grad[:, m].float()
    return total


def expand_to_mhc_bwd(o_grad: torch.Tensor) -> torch.Tensor:
    """``x_grad`` (bf16 ``(T, H)``) of the bf16 stream gradients ``o_grad`` ``(T, n, H)``."""
    return bf16_encode(stream_sum(o_grad)).view(torch.bfloat16)


def expand_to_mhc_bwd_exact(o_grad: torch.Tensor) -> torch.Tensor:
    """The float64 sum over the streams (no rounding), to measure the kernel's error against."""
    return o_grad.double().sum(dim=1)
