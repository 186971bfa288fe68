"""Number formats as vectorised torch functions (spec quant-a §1.4, §1.6, §1.7).

Every encoder works on fp32 bit patterns held in int64 tensors (unsigned 32-bit
values), so the results do not depend on how torch or the host converts floats.
"""

from __future__ import annotations

import torch

_U32 = 0xFFFFFFFF
_ABS = 0x7FFFFFFF
_INF = 0x7F800000
_MANT = 0x7FFFFF
_E4M3_MAX_BITS = 0x43E00000  # bits(448.0)
_E4M3_MAX_CODE = 0x7E
_E2M1_MAX_CODE = 7


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """The uint32 bit patterns of an fp32 tensor, as int64."""
    return x.to(torch.float32).view(torch.int32).to(torch.int64) & _U32


def f32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """The fp32 tensor whose bit patterns are ``bits`` (int32, or int64 holding uint32 values)."""
    if bits.dtype != torch.int32:
        bits = bits.to(torch.int64) & _U32
        bits = (bits - ((bits >> 31) << 32)).to(torch.int32)
    return bits.view(torch.float32)


def _round_shift_rne(sig: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``sig / 2**shift`` rounded to nearest, ties to even (sig < 2**24, 1 <= shift)."""
    shift = shift.clamp(max=40)
    kept = sig >> shift
    rem = sig & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (rem > half) | ((rem == half) & ((kept & 1) == 1))
    return kept + up.to(torch.int64)


def _rne_code(abs_bits: torch.Tensor, mant_bits: int, emin: int) -> torch.Tensor:
    """Unsigned code (exponent field << mant_bits | mantissa) of |x| rounded RNE to a
    format with ``mant_bits`` mantissa bits and minimum normal exponent ``emin``.

    Not saturated: codes above the format's largest finite code mean overflow.
    """
    biased = abs_bits >> 23
    sig = torch.where(biased == 0, abs_bits & _MANT, (abs_bits & _MANT) | 0x800000)
    exp = biased.clamp(min=1) - 127
    shift = (23 - mant_bits) + (emin - exp).clamp(min=0)
    # The rounded significand carries the implicit bit, which adds the missing 1
    # to the exponent field of normal results (and lets rounding carry into it).
    return ((exp - emin).clamp(min=0) << mant_bits) + _round_shift_rne(sig, shift)


def bf16_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 bit patterns (int16), RNE; NaN stays NaN with its sign."""
    bits = f32_bits(x)
    sign = (bits >> 16) & 0x8000
    abs_bits = bits & _ABS
    code = _rne_code(abs_bits, 7, -126)
    quiet_nan = (abs_bits >> 16) | 0x40
    code = torch.where(abs_bits > _INF, quiet_nan, code)
    out = sign | code
    return (out - ((out >> 15) << 16)).to(torch.int16)


def bf16_decode(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (int16 or uint16) -> fp32 (exact)."""
    return f32_from_bits((bits.to(torch.int64) & 0xFFFF) << 16)


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> E4M3 codes (uint8): RNE, finite saturation to ±448, NaN -> 0x7F | sign."""
    bits = f32_bits(x)
    sign = (bits >> 24) & 0x80
    abs_bits = bits & _ABS
    code = _rne_code(abs_bits, 3, -6).clamp(max=_E4M3_MAX_CODE)
    code = torch.where(abs_bits >= _E4M3_MAX_BITS, _E4M3_MAX_CODE, code)
    code = torch.where(abs_bits > _INF, 0x7F, code)
    return (sign | code).to(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """E4M3 codes (uint8) -> fp32 (exact; 0x7F/0xFF decode to NaN)."""
    c = codes.to(torch.int64) & 0xFF
    sign = (c & 0x80) << 24
    exp = (c >> 3) & 0xF
    mant = c & 0x7
    normal = ((exp + (127 - 7)) << 23) | (mant << 20)
    # Subnormal m·2^-9 (m = 1..7), normalised around its leading bit p.
    lead = (mant >= 2).to(torch.int64) + (mant >= 4).to(torch.int64)
    subnormal = ((lead + (127 - 9)) << 23) | ((mant << (23 - lead)) & _MANT)
    magnitude = torch.where(exp == 0, torch.where(mant == 0, 0, subnormal), normal)
    magnitude = torch.where((c & 0x7F) == 0x7F, 0x7FC00000, magnitude)
    return f32_from_bits(sign | magnitude)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> E2M1 nibble codes 0..15 (uint8): RNE ties to even code, saturate to ±6
    (inf and NaN included), sign bit always copied."""
    bits = f32_bits(x)
    sign = (bits >> 28) & 0x8
    code = _rne_code(bits & _ABS, 1, 0).clamp(max=_E2M1_MAX_CODE)
    return (sign | code).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 nibble codes (uint8, 0..15) -> fp32."""
    c = codes.to(torch.int64)
    sign = (c & 0x8) << 28
    exp = (c >> 1) & 0x3
    mant = c & 0x1
    normal = ((exp + 126) << 23) | (mant << 22)
    subnormal = mant * 0x3F000000  # m · 0.5
    return f32_from_bits(sign | torch.where(exp == 0, subnormal, normal))


def e2m1_pack(codes: torch.Tensor) -> torch.Tensor:
    """Nibble codes (..., 2n) -> int8 bytes (..., n); element 2j goes to the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"e2m1_pack needs an even last dim, got {tuple(codes.shape)}")
    c = codes.to(torch.uint8) & 0xF
    return (c[..., 0::2] | (c[..., 1::2] << 4)).view(torch.int8)


def e2m1_unpack(packed: torch.Tensor) -> torch.Tensor:
    """int8/uint8 bytes (..., n) -> nibble codes (..., 2n) as uint8, low nibble first."""
    b = packed.contiguous().view(torch.uint8)
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


def ue8m0_encode_ceil(x: torch.Tensor) -> torch.Tensor:
    """Biased exponent (uint8) of the power-of-two ceiling of non-negative fp32 ``x``: subnormals give
    1, values above 2^127 and inf give 255, 0 and every NaN give 0."""
    return (((f32_bits(x) + _MANT) & _INF) >> 23).to(torch.uint8)


def ue8m0_decode(exps: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> fp32 ``f32(e << 23)`` (so 0 -> 0.0 and 255 -> inf)."""
    return f32_from_bits((exps.to(torch.int64) & 0xFF) << 23)


def ue8m0_reciprocal(exps: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> fp32 ``1 / f32(e << 23)`` exactly: ``2^(127-e)``, so 254 -> 2^-127 (subnormal),
    255 -> 0.0 and 0 -> inf."""
    e = exps.to(torch.int64) & 0xFF
    bits = torch.where(e == 0, _INF, torch.where(e == 254, 0x400000, torch.where(e == 255, 0, (254 - e) << 23)))
    return f32_from_bits(bits)


def _word_dtype(pack: int) -> torch.dtype:
    if pack == 2:
        return torch.int16
    if pack == 4:
        return torch.int32
    raise ValueError(f"pack must be 2 (int16 words) or 4 (int32 words), got {pack}")


def ue8m0_pack(exps: torch.Tensor, pack: int, dim: int) -> torch.Tensor:
    """Pack a 2-D grid of UE8M0 bytes into little-endian int16 (pack 2) or int32 (pack 4)
    words along ``dim``; byte j of a word holds element ``pack·i + j``; unused bytes are 0.

    The result is contiguous with canonical strides.
    """
    dtype = _word_dtype(pack)
    if exps.dim() != 2 or dim not in (0, 1):
        raise ValueError("ue8m0_pack expects a 2-D tensor and dim 0 or 1")
    grid = exps.to(torch.int64) & 0xFF
    rows, cols = grid.shape
    shifts = torch.arange(pack, device=grid.device) * 8
    if dim == 1:
        num_words = -(-cols // pack)
        grid = torch.nn.functional.pad(grid, (0, num_words * pack - cols))
        words = (grid.reshape(rows, num_words, pack) << shifts).sum(dim=2)
    else:
        num_words = -(-rows // pack)
        grid = torch.nn.functional.pad(grid, (0, 0, 0, num_words * pack - rows))
        words = (grid.reshape(num_words, pack, cols) << shifts[:, None]).sum(dim=1)
    nbits = 8 * pack
    words = words - ((words >> (nbits - 1)) << nbits)
    return torch.empty(words.shape, dtype=dtype, device=words.device).copy_(words)


def ue8m0_unpack(words: torch.Tensor, pack: int, dim: int, n: int) -> torch.Tensor:
    """Inverse of :func:`ue8m0_pack`: words -> uint8 bytes, cropped to ``n`` along ``dim``."""
    _word_dtype(pack)
    if words.dim() != 2 or dim not in (0, 1):
        raise ValueError("ue8m0_unpack expects a 2-D tensor and dim 0 or 1")
    w = words.to(torch.int64)
    shifts = torch.arange(pack, device=w.device) * 8
    if dim == 1:
        grid = ((w.unsqueeze(2) >> shifts) & 0xFF).flatten(1)[:, :n]
    else:
        grid = ((w.unsqueeze(1) >> shifts[:, None]) & 0xFF).flatten(0, 1)[:n]
    return grid.to(torch.uint8).contiguous()


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """The integer view a kernel takes for a narrow float: bf16 as uint16, E4M3 and packed FP4 (int8) as
    uint8; other dtypes unchanged."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16)
    if t.dtype in (torch.float8_e4m3fn, torch.int8):
        return t.view(torch.uint8)
    return t
