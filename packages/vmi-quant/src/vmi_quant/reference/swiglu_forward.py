"""PyTorch reference of the SwiGLU forward ops (spec quant-b §6.1, §6.2, §0.5).

The element math (clamp, the sigmoid quotient with vmi's correctly rounded exp, the flavor's
division) is shared with the SwiGLU backward reference. Every step is one fp32 operation with
its own rounding, in the spec's order.
"""

from __future__ import annotations

import torch

from vmi_core.fp32 import divide, exp
from vmi_core.targets import Flavor
from vmi_quant.inputs import expert_rows
from vmi_quant.reference.cast import canonical_nan, cast, to_dtype


def clamp_gate_up(gate: torch.Tensor, up: torch.Tensor, clamp_value: float | None):
    """``(min(gate, c), clamp(up, -c, c))`` in fp32 (identity without ``c``); a NaN stays NaN."""
    if clamp_value is None:
        return gate, up
    c = torch.tensor(clamp_value, dtype=torch.float32)
    gate = torch.where(gate > c, c, gate)
    up = torch.where(up > c, c, torch.where(up < -c, -c, up))
    return gate, up


def silu(gate: torch.Tensor, flavor: str | Flavor) -> torch.Tensor:
    """``fl(gate / fl(1 + exp(-gate)))`` of an fp32 tensor: vmi's correctly rounded exp, the
    flavor's division."""
    denominator = 1.0 + exp(-gate)
    return divide(gate, denominator, flavor)


def row_weights(topk_weights: torch.Tensor | None, routed_scaling_factor: float | None):
    """Per-row fp32 weight ``fl(w · fl32(rsf))`` (``w`` without a factor), None without weights."""
    if topk_weights is None:
        return None
    if routed_scaling_factor is None:
        return topk_weights
    return topk_weights * torch.tensor(routed_scaling_factor, dtype=torch.float32)


def swiglu_forward(x: torch.Tensor, psum_num_tokens_per_expert: torch.Tensor | None = None,
                   topk_weights: torch.Tensor | None = None, routed_scaling_factor: float | None = None,
                   clamp_value: float | None = None, alignment: int = 128, flavor: str | Flavor = "ascend"):
    """SwiGLU of ``x = [gate | up]`` ``(N, 2H)``, weighted per row.

    Returns ``(y, valid, counts)``: ``y`` the fp32 ``(N, H)`` activation of every row (canonical
    NaNs), ``valid`` the bool ``(N,)`` rows of the expert layout (all rows without one), and
    ``counts`` the int64 ``(4,)`` clamp counts over the valid rows: gate above ``c``, up above
    ``c``, up below ``-c``, and the number of valid output elements (zeros without a clamp).
    """
    num_rows, width = x.shape
    hidden = width // 2
    gate = x[:, :hidden].float()
    up = x[:, hidden:].float()
    if psum_num_tokens_per_expert is None:
        valid = torch.ones(num_rows, dtype=torch.bool, device=x.device)
    else:
        valid = expert_rows(psum_num_tokens_per_expert, num_rows, alignment)
    counts = torch.zeros(4, dtype=torch.int64, device=x.device)
    if clamp_value is not None:
        c = torch.tensor(clamp_value, dtype=torch.float32)
        rows = valid[:, None]
        counts[0] = ((gate > c) & rows).sum()
        counts[1] = ((up > c) & rows).sum()
        counts[2] = ((up < -c) & rows).sum()
        counts[3] = valid.sum() * hidden
    gate, up = clamp_gate_up(gate, up, clamp_value)
    y = silu(gate, flavor) * up
    weights = row_weights(topk_weights, routed_scaling_factor)
    if weights is not None:
        y = y * weights[:, None]
    return canonical_nan(y), valid, counts


def swiglu_forward_and_per_token_cast(x: torch.Tensor, num_per_channels: int,
                                      psum_num_tokens_per_expert: torch.Tensor | None = None,
                                      topk_weights: torch.Tensor | None = None,
                                      routed_scaling_factor: float | None = None,
                                      use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                      use_packed_ue8m0: bool = False, clamp_value: float | None = None,
                                      alignment: int = 128, flavor: str | Flavor = "ascend"):
    """``swiglu_forward``'s fp32 activation quantized to E4M3 per ``(1, num_per_channels)`` group.

    Returns ``((data, sf), valid, counts)``; data and SF of every row (only the valid rows are
    defined by the op), the SF in the layout the flags give.
    """
    y, valid, counts = swiglu_forward(x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                                      clamp_value, alignment, flavor)
    quantized = cast(y, "e4m3", (1, num_per_channels), round_sf=round_sf,
                     use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, use_packed_ue8m0=use_packed_ue8m0,
                     flavor=flavor)
    return quantized, valid, counts


def swiglu_forward_and_per_channel_cast_and_transpose(x: torch.Tensor, num_per_tokens: int, round_sf: bool = False,
                                                      without_transpose: bool = False,
                                                      swiglu_clamp_value: float | None = None,
                                                      flavor: str | Flavor = "ascend"):
    """``swiglu_forward``'s activation of every row (no weights), rounded to bf16, quantized to E4M3
    per ``(num_per_tokens, 1)`` block (one scale per channel and token block). Returns
    ``(data, sf)``: data ``(H, T)`` (``(T, H)`` ``without_transpose``), fp32 sf ``(T / npt, H)``."""
    y, _, _ = swiglu_forward(x, clamp_value=swiglu_clamp_value, flavor=flavor)
    data, sf = cast(to_dtype(y, torch.bfloat16), "e4m3", (num_per_tokens, 1), round_sf=round_sf, flavor=flavor)
    return (data if without_transpose else data.T.contiguous()), sf
