"""PyTorch reference of the block casts (spec quant-a §1.6, §1.7, §1.11, §1.12).

This is the oracle every kernel is compared with bit for bit. A quantized input
("QuantTensor") is a tuple ``(data, sf)``: data float8_e4m3fn ``(M, K)`` or int8
FP4 ``(M, K/2)``; sf fp32, float8_e4m3fn or the flavor's packed UE8M0 words.
"""

from __future__ import annotations

import torch

from vmi_core.formats import (
    bf16_encode,
    e2m1_decode,
    e2m1_encode,
    e2m1_pack,
    e2m1_unpack,
    e4m3_decode,
    e4m3_encode,
    f32_bits,
    f32_from_bits,
    ue8m0_decode,
    ue8m0_pack,
    ue8m0_unpack,
)
from vmi_core.stochastic import random16, stochastic_round
from vmi_core.targets import Flavor, get_flavor
from vmi_quant.config import get_amax_clamp_for_quant, validate_quant_fmt

_Q = {"e4m3": 448.0, "e2m1": 6.0}


def _ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def _align(x: int, y: int) -> int:
    return _ceil_div(x, y) * y


def _expand(grid: torch.Tensor, block_size: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Broadcast a per-block grid to every element, cropped to ``shape``."""
    bm, bk = block_size
    return grid.repeat_interleave(bm, dim=0).repeat_interleave(bk, dim=1)[:shape[0], :shape[1]]


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """A copy with the row-major strides a freshly allocated tensor has (also for size-1 dims)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _is_col_major(sf: torch.Tensor) -> bool:
    return sf.stride(0) == 1 and sf.stride(1) != 1


def _decode_sf(sf: torch.Tensor, shape: tuple[int, int], block_size: tuple[int, int],
               flavor: Flavor) -> torch.Tensor:
    """Decode an input SF (any dtype and layout of §1.8) to its fp32 ``(nbm, nbk)`` grid."""
    if sf.dim() != 2:
        raise ValueError(f"sf must be 2-D, got shape {tuple(sf.shape)}")
    if not _is_col_major(sf) and sf.stride(1) != 1 and sf.numel() > 0:
        raise ValueError(f"sf must be row- or column-major, got strides {sf.stride()}")
    bm, bk = block_size
    nbm, nbk = _ceil_div(shape[0], bm), _ceil_div(shape[1], bk)
    pack = flavor.ue8m0_pack
    if sf.dtype == flavor.ue8m0_word_dtype:
        dim = 0 if bk == 1 else 1
        expected = (_ceil_div(nbm, pack), nbk) if dim == 0 else (nbm, _ceil_div(nbk, pack))
    elif sf.dtype in (torch.float32, torch.float8_e4m3fn):
        expected = (nbm, nbk)
    else:
        raise ValueError(f"sf dtype must be float32, float8_e4m3fn or {flavor.ue8m0_word_dtype} "
                         f"(flavor {flavor.name!r}), got {sf.dtype}")
    if tuple(sf.shape) != expected:
        raise ValueError(f"sf shape must be {expected} for data {shape} and block {block_size}, "
                         f"got {tuple(sf.shape)}")
    if sf.dtype == torch.float32:
        return sf.contiguous()
    if sf.dtype == torch.float8_e4m3fn:
        return e4m3_decode(sf.contiguous().view(torch.uint8))
    return ue8m0_decode(ue8m0_unpack(sf.contiguous(), pack, dim, nbm if dim == 0 else nbk))


def _decode_quant_tensor(x: tuple, block_size, flavor: Flavor) -> tuple[torch.Tensor, torch.Tensor]:
    """A QuantTensor -> (data as fp32 ``(M, K)``, its SF expanded to every element)."""
    if len(x) != 2:
        raise ValueError("a QuantTensor is a tuple (data, sf)")
    data, sf = x
    if data.dim() != 2:
        raise ValueError(f"data must be 2-D, got shape {tuple(data.shape)}")
    if data.dtype == torch.float8_e4m3fn:
        values = e4m3_decode(data.contiguous().view(torch.uint8))
    elif data.dtype == torch.int8:
        values = e2m1_decode(e2m1_unpack(data))
    else:
        raise ValueError(f"QuantTensor data must be float8_e4m3fn or int8 (FP4), got {data.dtype}")
    block_size = tuple(block_size)
    shape = tuple(values.shape)
    return values, _expand(_decode_sf(sf, shape, block_size, flavor), block_size, shape)


def canonical_nan(t: torch.Tensor) -> torch.Tensor:
    """``t`` (fp32 or bf16) with every NaN replaced by the canonical quiet NaN (+0x7FC00000 /
    +0x7FC0). IEEE 754 leaves the sign and payload of a NaN result open (torch's amax returns
    0xFFFFFFFF, x86 makes 0 · inf negative, CUDA returns 0x7FFFFFFF), so every NaN an op writes
    is made canonical, in the kernels too."""
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)


def to_dtype(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``y`` rounded to ``dtype`` (fp32 or bf16, RNE), every NaN the canonical +NaN (torch's own
    bf16 conversion writes 0xFFFF or 0x7FC0 for a NaN, depending on its code path)."""
    y = canonical_nan(y)
    return y if dtype == torch.float32 else bf16_encode(y).view(torch.bfloat16)


def _scale(c: torch.Tensor, fmt: str, round_sf: bool, use_e4m3_sf: bool):
    """Per-block (stored SF, quantization multiplier) from the clamped amax ``c`` (§1.6).

    The stored SF is fp32, or E4M3 codes (uint8) with ``use_e4m3_sf``. A NaN ``c`` gives a NaN SF
    (canonical fp32, E4M3 code 0x7F), or 0.0 with ``round_sf`` (the ceiling's bit formula maps
    every NaN to 0); an inf ``c`` gives inf (E4M3: 448).
    """
    q = torch.full_like(c, _Q[fmt])
    # A full tensor of Q keeps both divisions true IEEE divisions (no reciprocal-multiply).
    d = c / q
    if round_sf:
        sf = f32_from_bits((f32_bits(d) + 0x7FFFFF) & 0x7F800000)
        return sf, torch.ones_like(sf) / sf
    nan = torch.isnan(c)
    if use_e4m3_sf:
        codes = torch.where(nan, 0x7F, e4m3_encode(d)).to(torch.uint8)
        return codes, torch.ones_like(d) / e4m3_decode(codes)
    return canonical_nan(d), q / c


def _col_major(grid: torch.Tensor, align: int) -> torch.Tensor:
    """Copy of ``grid`` stored transposed, the storage row padded to ``align`` elements."""
    rows, cols = grid.shape
    row_stride = _align(rows, align)
    # as_strided keeps the stride (row_stride, 1) even when row_stride is 0 (empty grid).
    storage = torch.zeros(cols * row_stride, dtype=grid.dtype, device=grid.device).as_strided(
        (cols, row_stride), (row_stride, 1))
    storage[:, :rows] = grid.T
    return storage[:, :rows].T


def _layout_sf(sf: torch.Tensor, block_size: tuple[int, int], col_major: bool, packed: bool,
               use_e4m3_sf: bool, flavor: Flavor) -> torch.Tensor:
    """The per-block SF grid in the user-visible layout of §1.7."""
    if packed:
        exps = (f32_bits(sf) >> 23).to(torch.uint8)
        pack = flavor.ue8m0_pack
        if block_size[1] == 1:
            return ue8m0_pack(exps, pack, dim=0)
        words = ue8m0_pack(exps, pack, dim=1)
        return _col_major(words, flavor.col_major_align(pack)) if col_major else words
    if use_e4m3_sf:
        sf = sf.view(torch.float8_e4m3fn)
    if col_major:
        return _col_major(sf, flavor.col_major_align(sf.element_size()))
    return _canonical(sf)


def cast(x, fmt: str, block_size, sf: torch.Tensor | None = None, x_block_size=None,
         round_sf: bool = False, use_tma_aligned_col_major_sf: bool = False,
         use_packed_ue8m0: bool = False, use_e4m3_sf: bool = False, stochastic: bool = False,
         flavor: str | Flavor = "ascend"):
    """Block-quantize ``x`` to ``fmt`` ("e4m3" or "e2m1") with ``block_size = (bm, bk)``.

    Returns ``(data, sf)``, or only ``data`` when a precomputed ``sf`` is given.
    ``x`` is a bf16/fp32 ``(M, K)`` tensor or a QuantTensor tuple (needs ``x_block_size``).
    """
    validate_quant_fmt(fmt)
    if use_packed_ue8m0 and not round_sf:
        raise ValueError("use_packed_ue8m0 requires round_sf")
    if round_sf and use_e4m3_sf:
        raise ValueError("round_sf and use_e4m3_sf are mutually exclusive")
    flavor = get_flavor(flavor)
    bm, bk = block_size = tuple(block_size)
    if bm < 1 or bk < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if use_packed_ue8m0 and use_tma_aligned_col_major_sf and bk == 1:
        raise ValueError("packing along M (block_size[1] == 1) cannot be column-major")

    quantized = isinstance(x, tuple)
    if quantized:
        if x_block_size is None:
            raise ValueError("x_block_size is required for a QuantTensor input")
        values, sf_in = _decode_quant_tensor(x, x_block_size, flavor)
        xf = values * sf_in
    else:
        if x_block_size is not None:
            raise ValueError("x_block_size is only valid for a QuantTensor input")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"x must be float32 or bfloat16, got {x.dtype}")
        if x.dim() != 2:
            raise ValueError(f"x must be 2-D, got shape {tuple(x.shape)}")
        xf = x.float()
    h, w = xf.shape
    if fmt == "e2m1" and w % 2:
        raise ValueError(f"e2m1 output needs an even number of columns, got {w}")
    if stochastic and w % 4:
        raise ValueError(f"stochastic rounding needs the number of columns divisible by 4, got {w}")
    nbm, nbk = _ceil_div(h, bm), _ceil_div(w, bk)

    if sf is not None:
        if sf.dim() != 2 or tuple(sf.shape) != (nbm, nbk):
            raise ValueError(f"sf must have shape {(nbm, nbk)}, got {tuple(sf.shape)}")
        if sf.dtype not in (torch.float32, torch.float8_e4m3fn):
            raise ValueError(f"a given sf must be float32 or float8_e4m3fn, got {sf.dtype}")
        if _is_col_major(sf):
            raise ValueError("a given sf must be row-major")
        sf_value = sf.float() if sf.dtype == torch.float32 else e4m3_decode(sf.view(torch.uint8))
        multiplier = torch.ones_like(sf_value) / sf_value
        sf_grid = None
    else:
        amax = torch.nn.functional.pad(xf.abs(), (0, nbk * bk - w, 0, nbm * bm - h))
        amax = amax.reshape(nbm, bm, nbk, bk).amax(dim=(1, 3))
        clamp = torch.tensor(get_amax_clamp_for_quant(fmt, use_e4m3_sf), dtype=torch.float32)
        sf_grid, multiplier = _scale(torch.maximum(amax, clamp), fmt, round_sf, use_e4m3_sf)

    multiplier = _expand(multiplier, block_size, (h, w))
    if quantized and not flavor.dequant_before_scale and bk != 1:
        y = values * (sf_in * multiplier)
    else:
        y = xf * multiplier
    # A NaN product has no defined sign: make it +NaN before it feeds the stochastic-rounding hash
    # and the encoder (E4M3 0x7F, E2M1 +6).
    y = canonical_nan(y)
    if stochastic:
        counters = torch.arange(w // 4, dtype=torch.int64, device=y.device).expand(h, w // 4)
        y = stochastic_round(y, fmt, random16(y, counters))
    if fmt == "e4m3":
        data = _canonical(e4m3_encode(y).view(torch.float8_e4m3fn))
    else:
        data = _canonical(e2m1_pack(e2m1_encode(y)))
    if sf_grid is None:
        return data
    return data, _layout_sf(sf_grid, block_size, use_tma_aligned_col_major_sf, use_packed_ue8m0,
                            use_e4m3_sf, flavor)


def cast_back(x: tuple, fmt: str, block_size, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """Dequantize a QuantTensor ``(data, sf)``: ``fl32(data · sf)``, then fp32 or bf16 (RNE)."""
    if fmt not in ("fp32", "bf16"):
        raise ValueError(f"fmt must be 'fp32' or 'bf16', got {fmt!r}")
    if not isinstance(x, tuple):
        raise ValueError("cast_back expects a QuantTensor tuple (data, sf)")
    values, sf = _decode_quant_tensor(x, block_size, get_flavor(flavor))
    out = values * sf
    if fmt == "fp32":
        return _canonical(out)
    return _canonical(bf16_encode(out).view(torch.bfloat16))


def cast_and_cast_back(x: torch.Tensor, fmt: str, num_per_channels: int, round_sf: bool = False,
                       use_e4m3_sf: bool = False, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """The quantize-dequantize round trip of ``per_token_cast_and_cast_back`` (returned, not in place):
    ``cast`` to ``fmt`` in groups ``(1, num_per_channels)``, then ``cast_back`` to x's dtype, with
    every NaN of the result made canonical."""
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"x must be float32 or bfloat16, got {x.dtype}")
    block = (1, num_per_channels)
    quantized = cast(x, fmt, block, round_sf=round_sf, use_e4m3_sf=use_e4m3_sf, flavor=flavor)
    out_fmt = "fp32" if x.dtype == torch.float32 else "bf16"
    return canonical_nan(cast_back(quantized, out_fmt, block, flavor=flavor))
