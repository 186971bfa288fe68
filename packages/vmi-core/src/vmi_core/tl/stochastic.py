"""Stochastic rounding (SR) as lane-generic kernel functions (scalar or vector lanes,
``vmi_core.tl.simd``).

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

from .formats import flag, like, u32
from .simd import bitcast, cast, keep, maximum, minimum, select

# (mantissa bits, minimum normal exponent, largest finite fp32 bit pattern or None)
SR_FORMATS = {
    "bf16": (7, -126, None),
    "e4m3": (3, -6, 0x43E00000),
    "e2m1": (1, 0, 0x40C00000),
}

_W = (0x5671D42B, 0x9995E499, 0xACE1B8A5, 0xE153538D)


def sr_mix(b0, b1, b2, b3, counter):
    """The 32-bit quad hash ``h`` of four fp32 bit patterns and a counter (uint32, wrapping)."""
    h = keep(b0 * u32(_W[0]) + b1 * u32(_W[1]) + b2 * u32(_W[2]) + b3 * u32(_W[3]) + counter)
    h = keep((h ^ (h >> u32(23))) * u32(0x7FEB352D))
    return h ^ (h >> u32(16))


_WORD_MULTIPLIERS = (0x846CA68B, 0xD35A2D97)


def sr_word(h, w: int):
    """The 32-bit random word ``r0`` (``w = 0``) or ``r1`` (``w = 1``) of the hash ``h``."""
    r = keep(h * u32(_WORD_MULTIPLIERS[w]))
    return r ^ (r >> u32(11))


def sr_random16(h, p: int):
    """The 16-bit random number of element ``p`` (0..3, a Python int) of the quad hashed to ``h``."""
    return (sr_word(h, p // 2) >> u32(16 * (p % 2))) & u32(0xFFFF)


def sr_random16_at(h, p):
    """``sr_random16(h, p)`` for a lane value ``p`` (uint32 in 0..3): one word per lane."""
    r = keep(h * select(p > u32(1), u32(_WORD_MULTIPLIERS[1]), u32(_WORD_MULTIPLIERS[0])))
    return ((r ^ (r >> u32(11))) >> ((p & u32(1)) * u32(16))) & u32(0xFFFF)


def stochastic_round(x, r16, fmt: str):
    """``x`` (fp32) rounded stochastically onto ``fmt``'s grid, as fp32; encode it with RNE after."""
    man_bits, min_exp, max_bits = SR_FORMATS[fmt]
    # fp32 bits of the smallest step 2^(min_exp - man_bits): an fp32 subnormal for bf16 (2^-133).
    tiny_exp = min_exp - man_bits
    smallest_bits = (tiny_exp + 127) << 23 if tiny_exp >= -126 else 1 << (tiny_exp + 149)
    return _stochastic_round(x, r16, u32(23 - man_bits), u32(min_exp + 127), u32((max_bits or 0x7F800000) - 1),
                             u32(smallest_bits))


def _stochastic_round(x, r16, normal_dropped, min_biased_exp, keep_above_bits, smallest_bits):
    b = keep(bitcast(x, "uint32"))
    a = keep(b & u32(0x7FFFFFFF))
    exp = keep(a >> u32(23))
    sig = select(exp == u32(0), a, (a & u32(0x7FFFFF)) | u32(0x800000))
    # Small counts compare as int32: TVM rewrites uint32 ``x < c`` into ``x / c < 1``.
    dropped = keep(like(normal_dropped, exp)
                   + select(cast(maximum(exp, u32(1)), "int32") < cast(min_biased_exp, "int32"),
                            like(min_biased_exp, exp) - maximum(exp, u32(1)), u32(0)))
    mask = keep((like(u32(1), dropped) << minimum(dropped, u32(31))) - u32(1))
    up = keep(flag(r16 < select(dropped > u32(39), u32(0), (sig & mask) >> (dropped - u32(16)))))
    mag = select(cast(dropped, "int32") < 24, (a & (mask ^ u32(0xFFFFFFFF))) + (up << minimum(dropped, u32(23))),
                 up * smallest_bits)
    # Saturated, infinite and NaN inputs pass through: the RNE encoders saturate them.
    return bitcast(select(a > keep_above_bits, b, (b & u32(0x80000000)) | mag), "float32")
