"""Stochastic rounding, torch side (spec quant-a §1.10).

Random bits come from a stateless hash of the values and a position counter; the
rounding rule is the portable "truncate, then step away from zero iff R is below
the discarded bits" definition shared by every target.
"""

from __future__ import annotations

import torch

from vmi_core.formats import f32_bits, f32_from_bits

_U32 = 0xFFFFFFFF

# format -> (mantissa bits, minimum normal exponent, largest finite value or None)
_SR_FORMATS = {
    "bf16": (7, -126, None),
    "e4m3": (3, -6, 448.0),
    "e2m1": (1, 0, 6.0),
}


def _bits_of(value: float) -> int:
    return int(f32_bits(torch.tensor(value, dtype=torch.float32)))


def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """``a * b mod 2**32`` for uint32 values in int64, without int64 overflow."""
    lo = a * (b & 0xFFFF)
    hi = (a * (b >> 16)) & 0xFFFF
    return (lo + (hi << 16)) & _U32


def sr_hash(v0: torch.Tensor, v1: torch.Tensor, v2: torch.Tensor, v3: torch.Tensor,
            e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The SR hash of four fp32 bit patterns and a counter (uint32 values in int64)."""
    v0, v1, v2, v3, e = (t.to(torch.int64) & _U32 for t in (v0, v1, v2, v3, e))
    h = (_mul32(v0, 0x5671D42B) + _mul32(v1, 0x9995E499) + _mul32(v2, 0xACE1B8A5)
         + _mul32(v3, 0xE153538D) + e) & _U32
    h ^= h >> 23
    h = _mul32(h, 0x7FEB352D)
    h ^= h >> 16
    r0 = _mul32(h, 0x846CA68B)
    r0 ^= r0 >> 11
    r1 = _mul32(h, 0xD35A2D97)
    r1 ^= r1 >> 11
    return r0, r1


def random16(values: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """16-bit random numbers (int64) for ``values`` (..., n), hashed per quad of 4
    consecutive elements with ``counters`` (..., n/4); element p of a quad gets
    low16(r0), high16(r0), low16(r1), high16(r1) for p = 0, 1, 2, 3."""
    n = values.shape[-1]
    if n % 4:
        raise ValueError(f"random16 needs a last dim divisible by 4, got {n}")
    if tuple(counters.shape) != tuple(values.shape[:-1]) + (n // 4,):
        raise ValueError(f"counters must have shape {tuple(values.shape[:-1]) + (n // 4,)}, "
                         f"got {tuple(counters.shape)}")
    quads = f32_bits(values).reshape(*values.shape[:-1], n // 4, 4)
    r0, r1 = sr_hash(quads[..., 0], quads[..., 1], quads[..., 2], quads[..., 3], counters)
    r16 = torch.stack((r0 & 0xFFFF, r0 >> 16, r1 & 0xFFFF, r1 >> 16), dim=-1)
    return r16.reshape(values.shape)


def stochastic_round(x: torch.Tensor, fmt: str, r16: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x`` to the grid of ``fmt`` ("bf16", "e4m3", "e2m1"): truncate toward
    zero, then step one grid point away from zero iff ``r16`` < the discarded bits scaled
    to 16 bits. e4m3/e2m1 saturate to ±Q; NaN stays NaN (e2m1: ±6)."""
    if fmt not in _SR_FORMATS:
        raise ValueError(f"fmt must be one of {tuple(_SR_FORMATS)}, got {fmt!r}")
    mant_bits, emin, q_max = _SR_FORMATS[fmt]
    bits = f32_bits(x)
    sign = bits & 0x80000000
    a = bits & 0x7FFFFFFF
    r16 = r16.to(torch.int64)

    biased = a >> 23
    sig = torch.where(biased == 0, a & 0x7FFFFF, (a & 0x7FFFFF) | 0x800000)
    exp = biased.clamp(min=1) - 127
    # d: number of discarded significand bits; always >= 16 for these formats.
    d = (23 - mant_bits) + (emin - exp).clamp(min=0)
    in_normal_shift = d <= 23
    d_small = d.clamp(max=23)
    d_large = d.clamp(max=39)
    disc16 = torch.where(in_normal_shift,
                         (sig & ((1 << d_small) - 1)) >> (d_small - 16),
                         sig >> (d_large - 16))
    disc16 = torch.where(d >= 40, 0, disc16)
    up = (r16 < disc16).to(torch.int64)

    stepped = (a & ~((1 << d_small) - 1)) + (up << d_small)
    tiny_step = up * _bits_of(2.0 ** (emin - mant_bits))
    magnitude = torch.where(in_normal_shift, stepped, tiny_step)

    if q_max is None:
        # bf16: inf stays inf and NaN stays NaN (truncating a NaN could make it inf).
        magnitude = torch.where(a >= 0x7F800000, a, magnitude)
    else:
        # Saturation also covers inf, and NaN for e2m1 (NaN bits exceed every finite pattern).
        q_bits = _bits_of(q_max)
        magnitude = torch.where(a >= q_bits, q_bits, magnitude)
        if fmt == "e4m3":
            magnitude = torch.where(a > 0x7F800000, a, magnitude)
    return f32_from_bits(sign | magnitude)
