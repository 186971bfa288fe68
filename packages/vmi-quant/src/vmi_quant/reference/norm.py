"""PyTorch reference of the RMSNorm forward ops (spec quant-b §4.2, §4.3, §4.4).

Written from the spec's normative order, one fp32 operation per step:

1. ``r = x`` or ``r = f32(x + residual)`` rounded to x's dtype (torch's ``x + residual``, bit for bit
   but for NaN payloads: a NaN sum is the canonical +NaN);
2. ``S = sum r_i^2`` in vmi's fixed lane order (``vmi_core.sums.lane_sum_fused``: 64 per-lane
   partials of fused multiply-adds, then pairwise folds), the order the kernel uses;
3. ``rstd`` of ``S`` by ``vmi_core.rstd.rstd`` in the flavor's formula, a NaN made canonical;
4. ``y_i = f32(f32(r_i * rstd) * w'_i)`` with ``w' = f32(f32(w_i) * f32(out_scale))`` (or
   ``f32(out_scale)`` without a weight);
5. ``out = y`` rounded to x's dtype, every NaN made canonical (+0x7FC00000 / +0x7FC0);
6. the cast variant quantizes ``u = out`` (the rounded output, ``y`` itself for fp32) with the
   per-token cast reference in groups of 32.
"""

from __future__ import annotations

import torch

from vmi_core.rstd import rstd as rstd_of
from vmi_core.sums import lane_sum_fused
from vmi_core.targets import Flavor, get_flavor
from vmi_quant.reference.cast import canonical_nan, cast, to_dtype

NUM_PER_CHANNELS = 32
MEGA_SLAB = 128


def _align(x: int, y: int) -> int:
    return -(-x // y) * y


def norm_forward(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
                 out_scale: float = 1.0, flavor: str | Flavor = "ascend"):
    """``(out, rstd, r)`` of RMSNorm over the last dim of a bf16/fp32 ``x`` (2-D or 3-D).

    ``r`` is the normalised input (``x``, or ``x + residual`` rounded to x's dtype), ``rstd``
    float32 of ``x.shape[:-1]``, ``out`` of x's dtype.
    """
    flavor = get_flavor(flavor)
    hidden = x.shape[-1]
    r = x if residual is None else to_dtype(x.float() + residual.float(), x.dtype)
    rf = r.float()
    if rf.numel():
        rstd = canonical_nan(rstd_of(lane_sum_fused(rf, rf), hidden, eps, flavor))
    else:
        rstd = torch.empty(rf.shape[:-1], dtype=torch.float32, device=x.device)
    scale = torch.tensor(out_scale, dtype=torch.float32)
    factor = scale if weight is None else weight.float() * scale
    out = to_dtype((rf * rstd.unsqueeze(-1)) * factor, x.dtype)
    return out, rstd, r


def mega_moe_rows(num_tokens: int, block_m: int) -> torch.Tensor:
    """The Mega MoE SF row of each token (§4.4): runs of ``block_m`` tokens start at multiples of
    ``align(block_m, 128)``; in a 128-row slab of a run, in-slab index ``32a + b`` lands on row ``4b + a``."""
    t = torch.arange(num_tokens, dtype=torch.int64)
    i = t % block_m
    return ((t // block_m) * _align(block_m, MEGA_SLAB) + (i // MEGA_SLAB) * MEGA_SLAB + (i % 32) * 4
            + (i % MEGA_SLAB) // 32)


def mega_moe_window(mega_moe_sf: torch.Tensor) -> torch.Tensor:
    """All ``stride(1)`` rows of each word column of an M-major ``(T, W)`` Mega MoE SF buffer: the
    rows that tokens map to lie past ``T`` (a view of the same memory, ``(stride(1), W)``)."""
    return torch.as_strided(mega_moe_sf, (mega_moe_sf.stride(1), mega_moe_sf.shape[1]), (1, mega_moe_sf.stride(1)))


def _batched_sf(u: torch.Tensor, round_sf: bool, col_major: bool, packed: bool, flavor: Flavor) -> torch.Tensor:
    """The SF of a 3-D ``u`` ``(B, T, H)`` in the layout of §4.3: row-major ``(B*T, cols)`` viewed
    ``(B, T, cols)``; col-major as the col-major SF of the ``(T, B * align(H, 32 pk))`` matrix of the
    batches side by side (each zero-padded), viewed ``(B, T, cols)``."""
    b, t, h = u.shape
    block = (1, NUM_PER_CHANNELS)
    if not col_major:
        _, sf = cast(u.reshape(b * t, h), "e4m3", block, round_sf=round_sf, use_packed_ue8m0=packed, flavor=flavor)
        return sf.view(b, t, sf.shape[-1])
    pack = flavor.ue8m0_pack if packed else 1
    padded = _align(h, NUM_PER_CHANNELS * pack)
    side_by_side = torch.nn.functional.pad(u.float(), (0, padded - h)).permute(1, 0, 2).reshape(t, b * padded)
    _, sf = cast(side_by_side, "e4m3", block, round_sf=round_sf, use_tma_aligned_col_major_sf=True,
                 use_packed_ue8m0=packed, flavor=flavor)
    return sf.view(t, b, sf.shape[-1] // b).permute(1, 0, 2)


def norm_forward_and_per_token_cast(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                                    residual: torch.Tensor | None = None, out_scale: float = 1.0,
                                    round_sf: bool = False, use_tma_aligned_col_major_sf: bool = False,
                                    use_packed_ue8m0: bool = False, mega_moe_sf: torch.Tensor | None = None,
                                    mega_moe_block_m: int = 0, flavor: str | Flavor = "ascend"):
    """``(q, q_sf, out_bf16, rstd, r)``: ``norm_forward``'s rounded output ``u`` quantized to E4M3 in
    groups of 32 channels by the per-token cast reference.

    ``out_bf16`` is ``u`` for bf16 ``x`` and ``bf16(y)`` for fp32 ``x``. ``mega_moe_sf`` (2-D x only)
    is the ``mega_moe_window`` of the user's buffer, ``(R, H / 128)``; the result is a copy of it with the
    scales' exponent bytes written to the rows of §4.4 (``None`` when not given).
    """
    flavor = get_flavor(flavor)
    u, rstd, r = norm_forward(x, weight, eps, residual, out_scale, flavor)
    out_bf16 = to_dtype(u.float(), torch.bfloat16)
    shape = u.shape
    h = shape[-1]
    rows = u.reshape(-1, h)
    q, sf = cast(rows, "e4m3", (1, NUM_PER_CHANNELS), round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0,
                 use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf and u.dim() == 2, flavor=flavor)
    q = q.view(shape)
    if u.dim() == 3:
        sf = _batched_sf(u, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0, flavor)
    mega = None
    if mega_moe_sf is not None:
        mega = mega_moe_sf.clone()
        _, sf_fp32 = cast(rows, "e4m3", (1, NUM_PER_CHANNELS), round_sf=True, flavor=flavor)
        exponents = ((sf_fp32.view(torch.int32) >> 23) & 0xFF).to(torch.int64)
        words = (exponents.view(rows.shape[0], -1, 4) << torch.tensor([0, 8, 16, 24])).sum(-1)
        words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        mega[mega_moe_rows(rows.shape[0], mega_moe_block_m)] = words
    return q, sf, out_bf16, rstd, r, mega


def norm_forward_float64(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
                         residual: torch.Tensor | None = None, out_scale: float = 1.0):
    """``(y, rstd)`` in float64 from the same normalised input ``r``: the high-precision values the
    references are checked against (before rounding ``y`` to x's dtype)."""
    r = x if residual is None else x + residual
    rd = r.double()
    rstd = 1.0 / torch.sqrt((rd * rd).mean(-1) + eps)
    factor = out_scale if weight is None else weight.double() * out_scale
    return rd * rstd.unsqueeze(-1) * factor, rstd
