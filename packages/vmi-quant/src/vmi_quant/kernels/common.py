"""Kernel macros shared by the quantization ops: scales from amax, input decoding, data encoding."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.simd import cast, keep, maximum, select, widen
from vmi_core.tl.stochastic import sr_mix, sr_random16, stochastic_round
from vmi_quant.sf_layout import SFLayout, sf_address

QMAX = {"e4m3": 448.0, "e2m1": 6.0}

# Kernel-side dtype of each input format (narrow formats as integer bit views).
KERNEL_DTYPE = {"fp32": "float32", "bf16": "uint16", "e4m3": "uint8", "e2m1": "uint8"}


@dataclass(frozen=True)
class ScaleRule:
    """How a block amax becomes ``(sf, sf_inv)`` (spec: scale computation).

    ``round_sf``: power-of-two sf via reciprocal multiply and the exponent trick.
    ``e4m3_sf``: sf rounded to E4M3, ``sf_inv = 1 / sf``.
    Otherwise ``sf = c / Q`` and ``sf_inv = Q / c``, two independent divisions.
    ``stored``: what the SF tensor holds, ``"fp32"``, ``"e4m3"`` or ``"ue8m0"``.
    """

    fmt: str
    clamp: float
    round_sf: bool = False
    e4m3_sf: bool = False
    stored: str = "fp32"

    @property
    def qmax(self) -> float:
        return QMAX[self.fmt]


# The canonical NaN every quantization op writes (fp32 SF, and the value behind NaN codes):
# IEEE 754 leaves the sign and payload of a NaN result open, and targets differ (x86 makes
# 0 * inf negative, CUDA returns 0x7FFFFFFF, torch's amax returns 0xFFFFFFFF).
CANONICAL_NAN = 0x7FC00000
_F32_INF = 0x7F800000


def canonical_nan(x):
    """``x`` (fp32) with any NaN replaced by the canonical quiet NaN ``+0x7FC00000``."""
    b = keep(F.f32_bits(x))
    return F.f32_from_bits(select((b & F.u32(0x7FFFFFFF)) > F.u32(_F32_INF), F.u32(CANONICAL_NAN), b))


def is_nan_bits(bits):
    """Whether an |x| bit pattern (sign cleared) is a NaN."""
    return bits > F.u32(_F32_INF)


def clamped_amax(rule: ScaleRule, amax_bits):
    """``c = max(amax, clamp)`` from the |x| bit pattern of a block's amax; a NaN amax stays NaN
    (canonical), as ``torch.maximum`` keeps it (a float max would return the clamp)."""
    return select(is_nan_bits(amax_bits), F.f32_from_bits(F.u32(CANONICAL_NAN)),
                  maximum(F.f32_from_bits(amax_bits), F.f32_const(rule.clamp)))


def e4m3_scale_code(rule: ScaleRule, amax_bits):
    """The E4M3 sf code (as uint32) of a block: ``e4m3(c / Q)``, saturating (an inf amax gives
    448); a NaN amax gives 0x7F."""
    return select(is_nan_bits(amax_bits), F.u32(0x7F),
                  widen(F.f32_to_e4m3(clamped_amax(rule, amax_bits) / F.f32_const(rule.qmax))))


def scale_from_amax(rule: ScaleRule, amax_bits):
    """``(stored, sf_inv)`` of a block from the |x| bit pattern of its amax: what the SF tensor
    stores (fp32 sf, E4M3 code or UE8M0 byte, by ``rule.stored``) and the multiplier.

    Non-finite amax (see the README's "Non-finite values"): NaN gives sf NaN (canonical fp32,
    E4M3 code 0x7F) with sf_inv NaN, or with ``round_sf`` sf 0.0 (UE8M0 byte 0) and sf_inv inf;
    inf gives sf inf (UE8M0 byte 255) and sf_inv 0, or with an E4M3 SF 448 and sf_inv 1/448.
    """
    a = keep(amax_bits)
    if rule.round_sf:
        # The reference's power-of-two ceiling: NaN -> 0 (sf 0.0), inf -> 255 (sf inf).
        exponent = keep(F.ue8m0_ceil(clamped_amax(rule, a) * F.f32_const(np.float32(1.0) / np.float32(rule.qmax))))
        stored = cast(exponent, "uint8") if rule.stored == "ue8m0" else F.pow2_from_exponent(exponent)
        return stored, F.ue8m0_reciprocal(exponent)
    if rule.e4m3_sf:
        code = keep(e4m3_scale_code(rule, a))
        return cast(code, "uint8"), 1.0 / F.e4m3_to_f32(code)
    c = keep(clamped_amax(rule, a))
    return (select(is_nan_bits(a), F.f32_from_bits(F.u32(CANONICAL_NAN)), c / F.f32_const(rule.qmax)),
            F.like(F.f32_const(rule.qmax), c) / c)


def scale_value_from_amax(rule: ScaleRule, amax_bits):
    """Like ``scale_from_amax``, but the sf always as an fp32 value (an E4M3 sf decoded: NaN for
    code 0x7F), for kernels that dequantize with it instead of storing it."""
    if rule.e4m3_sf:
        sf = keep(F.e4m3_to_f32(e4m3_scale_code(rule, amax_bits)))
        return sf, 1.0 / sf
    return scale_from_amax(replace(rule, stored="fp32"), amax_bits)


def decode_scale(layout: SFLayout, stored):
    """A stored SF element (fp32, E4M3 code or UE8M0 byte) as fp32."""
    if layout.kind == "fp32":
        return stored
    elif layout.kind == "e4m3":
        return F.e4m3_to_f32(stored)
    else:
        return F.ue8m0_to_f32(stored)


def load_scale(layout: SFLayout, sf_flat, m, k, stride_m, stride_k):
    """SF block ``(m, k)`` of a flat SF buffer, decoded to fp32."""
    return decode_scale(layout, sf_flat[sf_address(m, k, stride_m, stride_k, layout)])


def encode(fmt: str, y):
    """RNE code of ``y`` in ``fmt`` (E4M3 as uint8, E2M1 as a 4-bit uint32). A NaN ``y`` (its sign
    is not defined) is encoded as the canonical +NaN: E4M3 0x7F, E2M1 +6 (code 7)."""
    y = canonical_nan(y)
    return F.f32_to_e4m3(y) if fmt == "e4m3" else F.f32_to_e2m1(y)


def decode_code(fmt: str, code):
    """The fp32 value of an ``encode`` result (E4M3 byte or E2M1 4-bit code)."""
    return F.e4m3_to_f32(code) if fmt == "e4m3" else F.e2m1_to_f32(code)


def dequantize(fmt: str, code, sf):
    """``fl32(decode(code) · sf)`` with a NaN product made canonical (0 · inf and NaN · x have no
    defined sign)."""
    return canonical_nan(decode_code(fmt, code) * sf)


@T.macro
def encode_stochastic_quad(fmt: str, y0, y1, y2, y3, counter, out, i, col):
    """Stochastically round and store the quad ``y0..y3`` whose first logical column is ``col``.

    E4M3 goes to ``out[i, col..col+3]``; E2M1 to the two bytes ``out[i, col/2..col/2+1]``.
    """
    v0 = T.alloc_var("float32")
    v1 = T.alloc_var("float32")
    v2 = T.alloc_var("float32")
    v3 = T.alloc_var("float32")
    h = T.alloc_var("uint32")
    # A NaN product has no defined sign: +NaN before it feeds the hash (as the reference does).
    v0 = canonical_nan(y0)
    v1 = canonical_nan(y1)
    v2 = canonical_nan(y2)
    v3 = canonical_nan(y3)
    h = sr_mix(T.reinterpret(v0, "uint32"), T.reinterpret(v1, "uint32"), T.reinterpret(v2, "uint32"),
               T.reinterpret(v3, "uint32"), counter)
    if fmt == "e4m3":
        out[i, col] = encode(fmt, stochastic_round(v0, sr_random16(h, 0), fmt))
        out[i, col + 1] = encode(fmt, stochastic_round(v1, sr_random16(h, 1), fmt))
        out[i, col + 2] = encode(fmt, stochastic_round(v2, sr_random16(h, 2), fmt))
        out[i, col + 3] = encode(fmt, stochastic_round(v3, sr_random16(h, 3), fmt))
    else:
        out[i, col // 2] = F.e2m1_pack(encode(fmt, stochastic_round(v0, sr_random16(h, 0), fmt)),
                                       encode(fmt, stochastic_round(v1, sr_random16(h, 1), fmt)))
        out[i, col // 2 + 1] = F.e2m1_pack(encode(fmt, stochastic_round(v2, sr_random16(h, 2), fmt)),
                                           encode(fmt, stochastic_round(v3, sr_random16(h, 3), fmt)))
