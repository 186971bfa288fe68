"""Kernel macros shared by the quantization ops: scales from amax, input decoding, data encoding."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tilelang.language as T

from vmi_core.sf_layout import SFLayout, sf_address
from vmi_core.tl import formats as F
from vmi_core.tl.stochastic import sr_mix, sr_random16, stochastic_round

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


@T.macro
def store_scale(rule: ScaleRule, amax_bits, sf_tile, sf_inv_tile, i, g):
    """From the |x| bit pattern of a block's amax, write ``sf_tile[i, g]`` (what the SF
    tensor stores: fp32 sf, E4M3 code or UE8M0 byte) and the multiplier ``sf_inv_tile[i, g]``."""
    c = T.max(F.f32_from_bits(amax_bits), F.f32_const(rule.clamp))
    if rule.round_sf:
        exponent = F.ue8m0_ceil(c * F.f32_const(np.float32(1.0) / np.float32(rule.qmax)))
        sf_inv_tile[i, g] = F.pow2_from_exponent(F.u32(254) - exponent)
        if rule.stored == "ue8m0":
            sf_tile[i, g] = T.Cast("uint8", exponent)
        else:
            sf_tile[i, g] = F.pow2_from_exponent(exponent)
    elif rule.e4m3_sf:
        code = F.f32_to_e4m3(c / F.f32_const(rule.qmax))
        sf_tile[i, g] = code
        sf_inv_tile[i, g] = T.float32(1.0) / F.e4m3_to_f32(code)
    else:
        sf_tile[i, g] = c / F.f32_const(rule.qmax)
        sf_inv_tile[i, g] = F.f32_const(rule.qmax) / c


@T.macro
def store_scale_value(rule: ScaleRule, amax_bits, sf_tile, sf_inv_tile, i, g):
    """Like ``store_scale``, but ``sf_tile[i, g]`` always gets the sf as an fp32 value (an E4M3
    sf decoded), for kernels that dequantize with it instead of storing it."""
    if rule.e4m3_sf:
        c = T.max(F.f32_from_bits(amax_bits), F.f32_const(rule.clamp))
        sf_tile[i, g] = F.e4m3_to_f32(F.f32_to_e4m3(c / F.f32_const(rule.qmax)))
        sf_inv_tile[i, g] = T.float32(1.0) / sf_tile[i, g]
    else:
        store_scale(replace(rule, stored="fp32"), amax_bits, sf_tile, sf_inv_tile, i, g)


@T.macro
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


def decode_element(in_fmt: str, tile, i, j):
    """Logical element ``(i, j)`` of an input tile as fp32 (FP4 tiles hold two codes per byte)."""
    if in_fmt == "fp32":
        return tile[i, j]
    if in_fmt == "bf16":
        return F.bf16_to_f32(tile[i, j])
    if in_fmt == "e4m3":
        return F.e4m3_to_f32(tile[i, j])
    return F.e2m1_to_f32(F.e2m1_unpack(tile[i, j // 2], j % 2))


def encode(fmt: str, y):
    """RNE code of ``y`` in ``fmt`` (E4M3 as uint8, E2M1 as a 4-bit uint32)."""
    return F.f32_to_e4m3(y) if fmt == "e4m3" else F.f32_to_e2m1(y)


def decode_code(fmt: str, code):
    """The fp32 value of an ``encode`` result (E4M3 byte or E2M1 4-bit code)."""
    return F.e4m3_to_f32(code) if fmt == "e4m3" else F.e2m1_to_f32(code)


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
    v0 = y0
    v1 = y1
    v2 = y2
    v3 = y3
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
