"""PyTorch reference of ``per_block_cast_lossless`` (spec quant-a §7.2): FP4 -> E4M3 re-quantization
to larger blocks without loss.

Each output block takes the exponent ``E_out = max(max E(b) - 6, 0)`` over the input blocks
``b`` it contains (``E(b)`` = the biased exponent of b's power-of-two SF); every value is
rescaled exactly by ``2^(E(b) - E_out)``, which needs ``E(b) + 5 >= E_out`` for every b.
"""

from __future__ import annotations

import torch

from vmi_core.formats import e2m1_decode, e2m1_unpack, e4m3_encode, f32_bits, f32_from_bits
from vmi_core.targets import Flavor, get_flavor
from vmi_quant.reference.cast import _canonical, _decode_sf, _expand, _layout_sf

# Output exponent = largest input exponent minus this (6 = log2 of 384 / 6: FP4's 6 times 2^6 stays in E4M3).
EXPONENT_HEADROOM = 6
# Input exponents may lie at most this far below the output exponent (FP4's 0.5 times 2^-5 is E4M3's
# smallest normal).
EXPONENT_FOOTROOM = 5


def check_power_of_two_sf(sf: torch.Tensor, name: str = "x sf") -> None:
    """Raise ValueError unless every element of an fp32 input SF is a positive normal power of two.

    Only the exponent bits of an fp32 SF are used (as the UE8M0 byte ``bits >> 23``), so any other
    value (a mantissa, a sign, 0.0, a subnormal, inf or NaN) would be re-quantized lossily. The legal
    values are exactly what UE8M0 bytes 1..254 decode to: 2^-126 .. 2^127.
    """
    if sf.dtype != torch.float32 or sf.numel() == 0:
        return
    bits = f32_bits(sf)
    exponent = bits >> 23
    bad = ((bits & 0x807FFFFF) != 0) | (exponent == 0) | (exponent == 255)
    if not bool(bad.any()):
        return
    index = tuple(int(i) for i in bad.nonzero()[0])
    value = float(sf[index])
    if value != value:
        reason = "NaN"
    elif value < 0 or (value == 0 and bits[index] >> 31):
        reason = "negative"
    elif value == 0.0:
        reason = "zero"
    elif value == float("inf"):
        reason = "infinite"
    elif exponent[index] == 0:
        reason = "subnormal"
    else:
        reason = "not a power of two"
    raise ValueError(f"{name} (float32) must hold positive normal powers of two (2^-126 .. 2^127): only "
                     f"their exponent bits are used, so any other value would be re-quantized lossily; "
                     f"{name}[{', '.join(map(str, index))}] = {value!r} is {reason}")


def check_ue8m0_sf_bytes(sf: torch.Tensor, shape: tuple[int, int], block_size: tuple[int, int], flavor: Flavor,
                         name: str = "x sf") -> None:
    """Raise ValueError unless every used byte of a packed UE8M0 input SF (the flavor's words, over
    ``block_size`` blocks of ``shape``) is 1..254: as for an fp32 SF, 2^-126 .. 2^127. Byte 0
    (2^-127, a subnormal) and byte 255 (NaN) would be re-quantized lossily; pad bytes are not read."""
    if sf.dtype != flavor.ue8m0_word_dtype or sf.numel() == 0:
        return
    exponent = f32_bits(_decode_sf(sf, shape, block_size, flavor)) >> 23
    bad = (exponent == 0) | (exponent == 255)
    if not bool(bad.any()):
        return
    index = tuple(int(i) for i in bad.nonzero()[0])
    byte = 0 if int(exponent[index]) == 0 else 255
    raise ValueError(f"{name} (packed UE8M0) must hold bytes 1..254 (2^-126 .. 2^127): the SF of block "
                     f"[{', '.join(map(str, index))}] is byte {byte} ({'2^-127, subnormal' if byte == 0 else 'NaN'})")


def per_block_cast_lossless(x: tuple, fmt: str, x_block_size, out_block_size, use_tma_aligned_col_major_sf=False,
                            round_sf=False, use_packed_ue8m0=False, flavor: str | Flavor = "ascend"):
    """Re-quantize an FP4 QuantTensor ``(data, sf)`` with blocks ``x_block_size`` to E4M3 with blocks
    ``out_block_size``; returns ``(data, sf)``. Raises ValueError if the input exponents of one output
    block span more than 11 binades (or an SF is negative)."""
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' (only FP4 -> E4M3 is lossless), got {fmt!r}")
    if use_packed_ue8m0 and not round_sf:
        raise ValueError("use_packed_ue8m0 requires round_sf")
    flavor = get_flavor(flavor)
    data, sf = x
    if data.dtype != torch.int8:
        raise ValueError(f"x data must be int8 (packed FP4), got {data.dtype}")
    if sf.dtype == torch.float8_e4m3fn:
        raise ValueError("x sf must hold powers of two (fp32 or packed UE8M0), not E4M3")
    check_power_of_two_sf(sf)
    codes = e2m1_unpack(data)
    shape = tuple(codes.shape)
    x_block, out_block = tuple(x_block_size), tuple(out_block_size)
    check_ue8m0_sf_bytes(sf, shape, x_block, flavor)
    if any(o % i for o, i in zip(out_block, x_block, strict=True)):
        raise ValueError(f"out_block_size {out_block} must be a multiple of x_block_size {x_block}")

    exponents = f32_bits(_decode_sf(sf, shape, x_block, flavor)) >> 23
    if bool((exponents > 255).any()):
        raise ValueError("x sf must not be negative")
    per_element = _expand(exponents, x_block, shape)
    bm, bk = out_block
    h, w = shape
    nbm, nbk = -(-h // bm), -(-w // bk)
    # Padding takes no part: -1 never wins the max, 256 never the min.
    padded = torch.nn.functional.pad(per_element, (0, nbk * bk - w, 0, nbm * bm - h), value=-1)
    e_max = padded.reshape(nbm, bm, nbk, bk).amax(dim=(1, 3))
    padded = torch.nn.functional.pad(per_element, (0, nbk * bk - w, 0, nbm * bm - h), value=256)
    e_min = padded.reshape(nbm, bm, nbk, bk).amin(dim=(1, 3))
    e_out = (e_max - EXPONENT_HEADROOM).clamp(min=0)
    if bool((e_min + EXPONENT_FOOTROOM < e_out).any()):
        raise ValueError("the SF exponents inside one output block span more than 11 binades; "
                         "the re-quantization would lose values")

    shift = per_element - _expand(e_out, out_block, shape) + 127
    values = e2m1_decode(codes) * f32_from_bits(shift << 23)
    out = _canonical(e4m3_encode(values).view(torch.float8_e4m3fn))
    out_sf = _layout_sf(f32_from_bits(e_out << 23), out_block, use_tma_aligned_col_major_sf, use_packed_ue8m0,
                        False, flavor)
    return out, out_sf
