"""Number formats as kernel macros, in integer bit math on fp32 patterns.

The same macros run on every target: the CPU backend has no bf16/fp8 types, and
integer math pins down rounding, saturation, signed zeros and subnormals exactly
(no flush-to-zero, no hardware NaN conventions). Narrow formats cross the kernel
boundary as integer bit views: bf16 as uint16, E4M3 and UE8M0 as uint8, FP4 as
uint8 bytes holding two codes (element ``2j`` in the low nibble).

The torch twins of these macros live in ``vmi_core.formats``; tests hold the
two against each other and against torch's own casts.
"""

from __future__ import annotations

import numpy as np
import tilelang.language as T

E4M3_MAX = 448.0
E2M1_MAX = 6.0

_F32_ABS = 0x7FFFFFFF
_F32_INF = 0x7F800000
_E4M3_MAX_BITS = 0x43E00000  # 448.0
_E4M3_MIN_NORMAL_BITS = 0x3C800000  # 2^-6
_E2M1_ONE_BITS = 0x3F800000  # 1.0, the smallest normal E2M1 magnitude


def u32(value: int):
    return T.uint32(value)


def f32_const(value: float):
    """An fp32 constant, rounded once from the Python float."""
    return T.float32(float(np.float32(value)))


@T.macro
def f32_bits(x):
    return T.reinterpret(x, "uint32")


@T.macro
def f32_from_bits(bits):
    return T.reinterpret(bits, "float32")


@T.macro
def abs_bits(x):
    """``|x|`` as an fp32 bit pattern (orders like |x| for non-NaN values)."""
    return T.reinterpret(x, "uint32") & u32(_F32_ABS)


@T.macro
def rne_shift_right(sig, shift):
    """``sig / 2^shift`` rounded to nearest, ties to even; ``shift`` in [1, 31]."""
    kept = sig >> shift
    rest = sig & ((u32(1) << shift) - u32(1))
    half = u32(1) << (shift - u32(1))
    return kept + T.Cast("uint32", (rest > half) | ((rest == half) & ((kept & u32(1)) == u32(1))))


@T.macro
def _subnormal_units(a, unit_exp_bias):
    """``|x|`` (abs bits ``a``) in units of ``2^(unit_exp_bias - 150)``, RNE, for small |x|."""
    exp = a >> u32(23)
    sig = T.if_then_else(exp == u32(0), a, (a & u32(0x7FFFFF)) | u32(0x800000))
    shift = T.min(u32(unit_exp_bias) - T.max(exp, u32(1)), u32(31))
    return rne_shift_right(sig, shift)


# --- bf16 -------------------------------------------------------------------------------------

@T.macro
def bf16_to_f32(bits16):
    return T.reinterpret(T.Cast("uint32", bits16) << u32(16), "float32")


@T.macro
def f32_to_bf16(x):
    """fp32 -> bf16 bits (uint16), round to nearest even; NaN stays a quiet NaN."""
    b = T.reinterpret(x, "uint32")
    rounded = (b + u32(0x7FFF) + ((b >> u32(16)) & u32(1))) >> u32(16)
    is_nan = (b & u32(_F32_ABS)) > u32(_F32_INF)
    return T.Cast("uint16", T.if_then_else(is_nan, (b >> u32(16)) | u32(0x40), rounded))


# --- fp8 e4m3 ---------------------------------------------------------------------------------

@T.macro
def e4m3_to_f32(code):
    c = T.Cast("uint32", code)
    sign = (c & u32(0x80)) << u32(24)
    exp = (c >> u32(3)) & u32(0xF)
    man = c & u32(0x7)
    normal = sign | ((exp + u32(120)) << u32(23)) | (man << u32(20))
    subnormal = sign | T.reinterpret(T.Cast("float32", man) * T.float32(2.0**-9), "uint32")
    is_nan = (c & u32(0x7F)) == u32(0x7F)
    return T.reinterpret(
        T.if_then_else(is_nan, sign | u32(0x7FC00000), T.if_then_else(exp == u32(0), subnormal, normal)),
        "float32")


@T.macro
def f32_to_e4m3(x):
    """fp32 -> E4M3 code (uint8): RNE, saturating to +-448 (inf too), NaN -> 0x7F, sign kept."""
    b = T.reinterpret(x, "uint32")
    a = b & u32(_F32_ABS)
    sign = (b >> u32(24)) & u32(0x80)
    normal = ((a + u32(0x7FFFF) + ((a >> u32(20)) & u32(1))) >> u32(20)) - u32(120 << 3)
    # Subnormal E4M3 codes count units of 2^-9 = 2^(141 - 150).
    code = T.if_then_else(
        a > u32(_F32_INF), u32(0x7F),
        T.if_then_else(a >= u32(_E4M3_MAX_BITS), u32(0x7E),
                       T.if_then_else(a >= u32(_E4M3_MIN_NORMAL_BITS), normal, _subnormal_units(a, 141))))
    return T.Cast("uint8", code | sign)


# --- fp4 e2m1 ---------------------------------------------------------------------------------

@T.macro
def e2m1_to_f32(code):
    c = T.Cast("uint32", code)
    sign = (c & u32(0x8)) << u32(28)
    exp = (c >> u32(1)) & u32(0x3)
    man = c & u32(0x1)
    normal = ((exp + u32(126)) << u32(23)) | (man << u32(22))
    subnormal = man * u32(0x3F000000)  # 0.5 or 0
    return T.reinterpret(sign | T.if_then_else(exp == u32(0), subnormal, normal), "float32")


@T.macro
def f32_to_e2m1(x):
    """fp32 -> E2M1 code (0..15, as uint32): RNE ties-to-even, saturating to +-6 (inf and NaN too)."""
    b = T.reinterpret(x, "uint32")
    a = b & u32(_F32_ABS)
    sign = (b >> u32(28)) & u32(0x8)
    normal = T.min(((a + u32(0x1FFFFF) + ((a >> u32(22)) & u32(1))) >> u32(22)) - u32(126 << 1), u32(7))
    # Subnormal E2M1 codes count units of 2^-1 = 2^(149 - 150).
    code = T.if_then_else(a >= u32(_F32_INF), u32(7),
                          T.if_then_else(a >= u32(_E2M1_ONE_BITS), normal, _subnormal_units(a, 149)))
    return code | sign


@T.macro
def e2m1_pack(lo_code, hi_code):
    """Two E2M1 codes in one byte, the even element in the low nibble."""
    return T.Cast("uint8", (T.Cast("uint32", lo_code) & u32(0xF)) | ((T.Cast("uint32", hi_code) & u32(0xF)) << u32(4)))


@T.macro
def e2m1_unpack(byte, index):
    """Code ``index`` (0 = low nibble, 1 = high nibble) of a packed byte."""
    return (T.Cast("uint32", byte) >> (u32(4) * T.Cast("uint32", index))) & u32(0xF)


# --- ue8m0 ------------------------------------------------------------------------------------

@T.macro
def ue8m0_to_f32(exponent):
    """A UE8M0 exponent byte as fp32: ``2^(e-127)``; 0 decodes to 0.0 and 255 to inf."""
    return T.reinterpret(T.Cast("uint32", exponent) << u32(23), "float32")


@T.macro
def ue8m0_ceil(t):
    """Biased exponent of the power-of-two ceiling of a positive normal fp32 ``t``."""
    return ((T.reinterpret(t, "uint32") - u32(1)) >> u32(23)) + u32(1)


@T.macro
def pow2_from_exponent(exponent):
    """``2^(e-127)`` as fp32 from a biased exponent (uint32)."""
    return T.reinterpret(exponent << u32(23), "float32")
