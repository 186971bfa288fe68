"""Number formats as lane-generic kernel functions, in integer bit math on fp32 patterns.

The same functions run on every target and on both kinds of lane value (``vmi_core.tl.simd``):
scalar expressions (cpu, cuda, Ascend SIMT) and 64-lane vector registers (Ascend SIMD). The
CPU backend has no bf16/fp8 types, and integer math pins down rounding, saturation, signed
zeros and subnormals exactly (no flush-to-zero, no hardware NaN conventions). Narrow formats
cross the kernel boundary as integer bit views: bf16 as uint16, E4M3 and UE8M0 as uint8, FP4 as
uint8 bytes holding two codes (element ``2j`` in the low nibble).

Intermediates used more than once go through ``keep`` (a ``T.alloc_var`` scalar or a bound
vector register), so nested calls do not repeat their arguments' expressions. Unsigned
comparisons are written ``a > c - 1``: TVM's simplifier turns ``a >= c`` on uint32 into a
division ``1 <= a / c``.

The torch twins of these functions live in ``vmi_core.formats``; tests hold the two against
each other and against torch's own casts.
"""

from __future__ import annotations

import numpy as np

from .lazy import T
from .simd import Pred, Vec, absolute, bitcast, cast, fma, keep, minimum, select, widen

E4M3_MAX = 448.0
E2M1_MAX = 6.0

_F32_ABS = 0x7FFFFFFF
_F32_SIGN = 0x80000000
_F32_INF = 0x7F800000
_F32_MIN_NORMAL_BITS = 0x00800000
_E4M3_MAX_BITS = 0x43E00000  # 448.0
_E4M3_MIN_NORMAL_BITS = 0x3C800000  # 2^-6
_E2M1_ONE_BITS = 0x3F800000  # 1.0, the smallest normal E2M1 magnitude


def u32(value: int):
    return T.uint32(value)


def like(value, lanes):
    """The constant ``value`` as a lane value of the same kind as ``lanes`` (a vector when it is one)."""
    return Vec.splat(value, lanes.dtype) if isinstance(lanes, Vec) else value


def f32_const(value: float):
    """An fp32 constant, rounded once from the Python float, that every target reproduces.

    TVM's C code generator prints fp32 literals with 7 significant digits, which moves
    about half of all fp32 values by 1-4 ulp. Values that survive that printing stay
    literals; the others are written as their bit pattern, reinterpreted.
    """
    f = np.float32(value)
    if np.float32(float(f"{f:e}")) == f:
        return T.float32(float(f))
    return T.reinterpret(T.uint32(int(f.view(np.uint32))), "float32")


def f32_bits(x):
    return bitcast(x, "uint32")


def f32_from_bits(bits):
    return bitcast(bits, "float32")


def abs_bits(x):
    """``|x|`` as an fp32 bit pattern (orders like |x| for non-NaN values)."""
    return bitcast(x, "uint32") & u32(_F32_ABS)


def flush_subnormal(x):
    """fp32 ``x`` with a subnormal value replaced by the zero of its sign (as the Ascend vector
    division treats its operands and result); the torch twin is ``vmi_core.fp32.flush_subnormal``."""
    bits = keep(f32_bits(x))
    return f32_from_bits(select((bits & u32(_F32_ABS)) < u32(_F32_MIN_NORMAL_BITS), bits & u32(_F32_SIGN), bits))


def ascend_quotient(num, den, flushed_den=None):
    """The Ascend fp32 vector division of fp32 scalars, as scalar code: TileLang's
    ``vdiv_0ulp_ftz_true``. The instruction's quotient ``q`` (subnormal operands and result
    flushed to signed zero, correctly rounded), then its neighbour below or above (by bit pattern)
    where that one's residual ``|fma(q', -den, num)|`` is smaller (the one below also where it is
    equal): the wrapper's correction of an instruction that may be an ulp off. It moves a correctly
    rounded quotient only where the residuals underflow (quotients below about 2^-100). Zeros,
    infinities and NaN stay. ``flushed_den``: ``flush_subnormal(den)``, when the caller divides
    several values by one denominator. Inside a SIMD region the vector ``/`` is this division;
    the torch twin is ``vmi_core.fp32.ascend_quotient``."""
    num = keep(f32_const(num) if isinstance(num, float) else num)
    den = keep(f32_const(den) if isinstance(den, float) else den)
    if flushed_den is None:
        flushed_den = keep(flush_subnormal(den))
    q = keep(flush_subnormal(flush_subnormal(num) / flushed_den))
    bits = keep(f32_bits(q))
    below = keep(f32_from_bits(bits - u32(1)))
    above = keep(f32_from_bits(bits + u32(1)))
    neg_den = keep(-den)
    residual = keep(absolute(fma(q, neg_den, num)))
    residual_below = keep(absolute(fma(below, neg_den, num)))
    keep_q = keep(residual < residual_below)
    best = keep(select(keep_q, residual, residual_below))
    pick = keep(select(keep_q, q, below))
    pick = keep(select(absolute(fma(above, neg_den, num)) < best, above, pick))
    # q zero or not finite, as one unsigned compare of the bits without the sign (2·bits - 1 wraps
    # for zeros): GCC does not vectorize an element loop with a C ``|`` of two conditions.
    special = ((bits << u32(1)) - u32(1)) >= u32(2 * _F32_INF - 1)
    return keep(select(special, q, pick))


def flavor_quotient(num, den, ascend_division: bool, in_simd: bool):
    """``num / den`` of fp32 lane values as the flavor divides: IEEE (``ascend_division`` False),
    else the Ascend vector division, which is the vector ``/`` itself in a SIMD region
    (``in_simd``) and ``ascend_quotient`` in scalar code."""
    if ascend_division and not in_simd:
        return ascend_quotient(num, den)
    return num / den


def flag(cond):
    """A lane condition as 0 or 1 (uint32)."""
    return select(cond, u32(1), u32(0)) if isinstance(cond, Pred) else T.Cast("uint32", cond)


def _subnormal_units(a, unit_exp_bias):
    """``|x|`` (abs bits ``a``, below 2^22 units) in units of ``2^(unit_exp_bias - 150)``, RNE.

    One fp32 addition rounds: next to 2^23 units one ulp is one unit, so ``|x| + 2^23 units``
    is |x| rounded to whole units, nearest, ties to even (IEEE addition on every target), and
    its low mantissa bits count them. No per-lane shift amounts: the lanes stay vectorizable.
    An fp32 subnormal |x| (flushed to zero by some vector units) is 0 units either way.
    """
    magic = u32(unit_exp_bias << 23)
    total = f32_from_bits(a) + f32_from_bits(like(magic, a))
    return f32_bits(total) - magic


# --- bf16 -------------------------------------------------------------------------------------

def bf16_to_f32(bits16):
    return bitcast(widen(bits16) << u32(16), "float32")


def f32_to_bf16(x):
    """fp32 -> bf16 bits (uint16), round to nearest even; NaN stays a quiet NaN."""
    b = keep(bitcast(x, "uint32"))
    return cast(select((b & u32(_F32_ABS)) > u32(_F32_INF), (b >> u32(16)) | u32(0x40),
                       (b + u32(0x7FFF) + ((b >> u32(16)) & u32(1))) >> u32(16)), "uint16")


# --- fp8 e4m3 ---------------------------------------------------------------------------------

def e4m3_to_f32(code):
    c = keep(widen(code))
    sign = keep((c & u32(0x80)) << u32(24))
    exp = keep((c >> u32(3)) & u32(0xF))
    normal = sign | ((exp + u32(120)) << u32(23)) | ((c & u32(0x7)) << u32(20))
    subnormal = sign | bitcast(cast(c & u32(0x7), "float32") * T.float32(2.0**-9), "uint32")
    return bitcast(
        select((c & u32(0x7F)) == u32(0x7F), sign | u32(0x7FC00000), select(exp == u32(0), subnormal, normal)),
        "float32")


def f32_to_e4m3(x):
    """fp32 -> E4M3 code (uint8): RNE, saturating to +-448 (inf too), NaN -> 0x7F, sign kept."""
    b = keep(bitcast(x, "uint32"))
    a = keep(b & u32(_F32_ABS))
    normal = ((a + u32(0x7FFFF) + ((a >> u32(20)) & u32(1))) >> u32(20)) - u32(120 << 3)
    # Subnormal E4M3 codes count units of 2^-9 = 2^(141 - 150).
    code = select(
        a > u32(_F32_INF), u32(0x7F),
        select(a > u32(_E4M3_MAX_BITS - 1), u32(0x7E),
               select(a > u32(_E4M3_MIN_NORMAL_BITS - 1), normal, _subnormal_units(a, 141))))
    return cast(code | ((b >> u32(24)) & u32(0x80)), "uint8")


# --- fp4 e2m1 ---------------------------------------------------------------------------------

def e2m1_to_f32(code):
    c = keep(widen(code))
    exp = keep((c >> u32(1)) & u32(0x3))
    normal = ((exp + u32(126)) << u32(23)) | ((c & u32(0x1)) << u32(22))
    subnormal = (c & u32(0x1)) * u32(0x3F000000)  # 0.5 or 0
    return bitcast(((c & u32(0x8)) << u32(28)) | select(exp == u32(0), subnormal, normal), "float32")


def f32_to_e2m1(x):
    """fp32 -> E2M1 code (0..15, as uint32): RNE ties-to-even, saturating to +-6 (inf and NaN too)."""
    b = keep(bitcast(x, "uint32"))
    a = keep(b & u32(_F32_ABS))
    normal = minimum(((a + u32(0x1FFFFF) + ((a >> u32(22)) & u32(1))) >> u32(22)) - u32(126 << 1), u32(7))
    # Subnormal E2M1 codes count units of 2^-1 = 2^(149 - 150).
    code = select(a > u32(_F32_INF - 1), u32(7),
                  select(a > u32(_E2M1_ONE_BITS - 1), normal, _subnormal_units(a, 149)))
    return code | ((b >> u32(28)) & u32(0x8))


def e2m1_pack(lo_code, hi_code):
    """Two E2M1 codes in one byte, the even element in the low nibble."""
    return cast((widen(lo_code) & u32(0xF)) | ((widen(hi_code) & u32(0xF)) << u32(4)), "uint8")


def e2m1_unpack(byte, index):
    """Code ``index`` (0 = low nibble, 1 = high nibble) of a packed byte."""
    return (widen(byte) >> (u32(4) * T.Cast("uint32", index))) & u32(0xF)


# --- ue8m0 ------------------------------------------------------------------------------------

def ue8m0_to_f32(exponent):
    """A UE8M0 exponent byte as fp32: ``2^(e-127)``; 0 decodes to 0.0 and 255 to inf."""
    return bitcast(widen(exponent) << u32(23), "float32")


def ue8m0_ceil(t):
    """Biased exponent (0..255, as uint32) of the power-of-two ceiling of a non-negative fp32 ``t``:
    ``(bits(t) + 0x7FFFFF) & 0x7F800000``, the reference's rounding. Subnormal ``t`` gives 1,
    ``t > 2^127`` and inf give 255 (inf), 0 gives 0 and every NaN gives 0 (0.0)."""
    return ((bitcast(t, "uint32") + u32(0x7FFFFF)) & u32(_F32_INF)) >> u32(23)


def pow2_from_exponent(exponent):
    """``2^(e-127)`` as fp32 from a biased exponent (uint32); like UE8M0, 0 gives 0.0 and 255 inf."""
    return bitcast(exponent << u32(23), "float32")


def ue8m0_reciprocal(exponent):
    """``1 / pow2_from_exponent(e)`` exactly, for a biased exponent 0..255 (uint32): ``2^(127-e)``,
    so 254 gives the subnormal 2^-127, 255 (inf) gives 0.0 and 0 (0.0) gives inf."""
    e = keep(exponent)
    return bitcast(
        select(e > u32(253), select(e == u32(254), u32(0x400000), u32(0)),
               select(e == u32(0), u32(_F32_INF), (like(u32(254), e) - e) << u32(23))),
        "float32")
