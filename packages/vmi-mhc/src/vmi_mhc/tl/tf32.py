"""TF32 operands of the prenorm GEMM, as lane-generic kernel functions (scalars on cpu, cuda and
Ascend SIMT; 64-lane registers in Ascend SIMD regions).

A TF32 value has 10 explicit mantissa bits (11 significant bits) and fp32's exponent range. The
GEMM's fp32 operands (``fn_eff`` in the forward, ``d_out_mul`` in the backward) are rounded to
TF32 explicitly, half away from zero: ``(bits + 0x1000) & ~0x1FFF`` (spec §3.4.2; the sources add
``0x1000`` and leave the truncation to the tensor core). Then every target multiplies the same
values, and since a TF32 value times a TF32 or bf16 value is exact in fp32, targets differ only in
the order their fp32 accumulations add the products.

A matrix unit takes the TF32 value as two bf16 operands ``hi + lo`` (``split_hi``/``split_lo``):
``hi`` keeps the top 8 significant bits (bf16 truncation), ``lo = v - hi`` the remaining 3, exact
in bf16 whenever ``lo`` is an fp32 normal number (``|v| >= 2^-116``); two bf16 products into one
fp32 accumulator then give the TF32 product exactly. The torch twins are in
``vmi_mhc.reference.pre_norm_fn_gemm``.
"""

from __future__ import annotations

from vmi_core.tl.formats import bf16_to_f32, u32
from vmi_core.tl.simd import bitcast, cast, keep, select

_ABS = 0x7FFFFFFF
_INF = 0x7F800000
_TF32_HALF_ULP = 0x1000
_TF32_LOW_BITS = 0x1FFF
_BF16_HIGH = 0xFFFF0000
_BF16_QUIET_NAN = 0x7FC0


def round_to_tf32(x):
    """fp32 ``x`` rounded to TF32 (10 mantissa bits), half away from zero, as fp32.

    Carries propagate into the exponent: magnitudes from ``(2 - 2^-11) · 2^127`` on become
    infinite; infinities stay infinite; a NaN whose payload lies only in the 13 dropped bits
    becomes an infinity (the bit rule, as on the sources' tensor cores).
    """
    bits = bitcast(x, "uint32")
    return bitcast((bits + u32(_TF32_HALF_ULP)) & u32(~_TF32_LOW_BITS & 0xFFFFFFFF), "float32")


def split_hi(v):
    """bf16 bits (uint16) of the high part of TF32 ``v``: its top 8 significant bits; a NaN
    becomes the quiet NaN, an infinity stays infinite."""
    bits = keep(bitcast(v, "uint32"))
    is_nan = (bits & u32(_ABS)) > u32(_INF)
    return cast(select(is_nan, u32(_BF16_QUIET_NAN), bits >> u32(16)), "uint16")


def split_lo(v, hi_bits):
    """bf16 bits (uint16) of ``v - hi`` for TF32 ``v`` and its ``split_hi`` bits: exact for finite
    ``v`` with ``|v| >= 2^-116`` (below that, truncated to bf16); +0 for a non-finite ``v``."""
    bits = bitcast(v, "uint32")
    finite = (bits & u32(_ABS)) < u32(_INF)
    rest = bitcast(v - bf16_to_f32(hi_bits), "uint32")
    return cast(select(finite, rest >> u32(16), u32(0)), "uint16")


def join(hi_bits, lo_bits):
    """The fp32 value ``hi + lo`` of a split (exact: the two parts do not overlap)."""
    return bf16_to_f32(hi_bits) + bf16_to_f32(lo_bits)
