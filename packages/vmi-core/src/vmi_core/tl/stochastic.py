"""Stochastic rounding (SR) as kernel macros.

Random bits come from a stateless hash of the values themselves and a position
counter (no seed, no RNG state), so identical inputs give identical outputs on
every target. A quad of four consecutive fp32 values ``v0..v3`` and a counter
``e`` give a hash ``h`` and from it two 32-bit words ``r0, r1``; element ``p`` of the quad rounds with the
16-bit number ``R_p = low16(r0), high16(r0), low16(r1), high16(r1)``.

Rounding rule, for every output format: truncate toward zero to the target grid,
then step one grid point away from zero iff ``R_p`` is below the discarded bits
scaled to 16 bits. E4M3 and E2M1 saturate at their largest finite value; bf16 does
not (the largest finite value may step to infinity). The torch twin is
``vmi_core.stochastic``.
"""

from __future__ import annotations

import tilelang.language as T

from .formats import u32

# (mantissa bits, minimum normal exponent, largest finite fp32 bit pattern or None)
SR_FORMATS = {
    "bf16": (7, -126, None),
    "e4m3": (3, -6, 0x43E00000),
    "e2m1": (1, 0, 0x40C00000),
}

_W = (0x5671D42B, 0x9995E499, 0xACE1B8A5, 0xE153538D)


@T.macro
def sr_mix(b0, b1, b2, b3, counter):
    """The 32-bit quad hash ``h`` of four fp32 bit patterns and a counter."""
    h = T.alloc_var("uint32")
    h = b0 * u32(_W[0]) + b1 * u32(_W[1]) + b2 * u32(_W[2]) + b3 * u32(_W[3]) + counter
    h = (h ^ (h >> u32(23))) * u32(0x7FEB352D)
    return h ^ (h >> u32(16))


_WORD_MULTIPLIERS = (0x846CA68B, 0xD35A2D97)


@T.macro
def sr_word(h, w: int):
    """The 32-bit random word ``r0`` (``w = 0``) or ``r1`` (``w = 1``) of the hash ``h``."""
    r = T.alloc_var("uint32")
    r = h * u32(_WORD_MULTIPLIERS[w])
    return r ^ (r >> u32(11))


@T.macro
def sr_random16(h, p: int):
    """The 16-bit random number of element ``p`` (0..3, a Python int) of the quad hashed to ``h``."""
    return (sr_word(h, p // 2) >> u32(16 * (p % 2))) & u32(0xFFFF)


def stochastic_round(x, r16, fmt: str):
    """``x`` (fp32) rounded stochastically onto ``fmt``'s grid, as fp32; encode it with RNE after."""
    man_bits, min_exp, max_bits = SR_FORMATS[fmt]
    # fp32 bits of the smallest step 2^(min_exp - man_bits): an fp32 subnormal for bf16 (2^-133).
    tiny_exp = min_exp - man_bits
    smallest_bits = (tiny_exp + 127) << 23 if tiny_exp >= -126 else 1 << (tiny_exp + 149)
    return _stochastic_round(x, r16, u32(23 - man_bits), u32(min_exp + 127), u32((max_bits or 0x7F800000) - 1),
                             u32(smallest_bits))


@T.macro
def _stochastic_round(x, r16, normal_dropped, min_biased_exp, keep_above_bits, smallest_bits):
    b = T.alloc_var("uint32")
    a = T.alloc_var("uint32")
    exp = T.alloc_var("uint32")
    dropped = T.alloc_var("uint32")
    mask = T.alloc_var("uint32")
    up = T.alloc_var("uint32")
    b = T.reinterpret(x, "uint32")
    a = b & u32(0x7FFFFFFF)
    exp = a >> u32(23)
    sig = T.Select(exp == u32(0), a, (a & u32(0x7FFFFF)) | u32(0x800000))
    # Small counts compare as int32: TVM rewrites uint32 ``x < c`` into ``x / c < 1``.
    dropped = normal_dropped + T.Select(T.Cast("int32", T.max(exp, u32(1))) < T.Cast("int32", min_biased_exp),
                                        min_biased_exp - T.max(exp, u32(1)), u32(0))
    mask = (u32(1) << T.min(dropped, u32(31))) - u32(1)
    up = T.Cast("uint32", r16 < T.Select(dropped > u32(39), u32(0), (sig & mask) >> (dropped - u32(16))))
    mag = T.Select(T.Cast("int32", dropped) < 24, (a & ~mask) + (up << T.min(dropped, u32(23))),
                   up * smallest_bits)
    # Saturated, infinite and NaN inputs pass through: the RNE encoders saturate them.
    return T.reinterpret(T.Select(a > keep_above_bits, b, (b & u32(0x80000000)) | mag), "float32")
