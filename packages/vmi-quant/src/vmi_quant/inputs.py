"""Validation and decoding of the quantization ops' arguments.

Everything here runs before any kernel: bad input raises ``TypeError`` (wrong type
or dtype) or ``ValueError`` (wrong shape, stride, device or option) naming the
argument, and outputs are never partially written.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_int, check_int_choice, check_kernel_extent, check_tensor, is_traced
from vmi_core.plan import with_values
from vmi_core.targets import Flavor
from vmi_quant.sf_layout import SFLayout, align, ceil_div

from .config import validate_quant_fmt

PLAIN_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
QUANT_DTYPES = {torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}
OUT_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8}
NUM_PER_CHANNELS = (16, 32, 64, 128)


@dataclass
class CastInput:
    """A decoded input: data tensor, its format and logical shape; input SF if pre-quantized."""

    data: torch.Tensor
    fmt: str
    num_tokens: int
    hidden: int
    sf: torch.Tensor | None = None
    sf_layout: SFLayout | None = None
    block_size: tuple[int, int] | None = None


def logical_cols(fmt: str, physical: int) -> int:
    return physical * 2 if fmt == "e2m1" else physical


def physical_cols(fmt: str, logical: int) -> int:
    return logical // 2 if fmt == "e2m1" else logical


def split_quantized(x) -> tuple:
    """``(data, sf)`` of a pre-quantized ``x`` tuple, ``(x, None)`` of a plain tensor."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"x must be a torch.Tensor or a (data, sf) tuple, got a {type(x).__name__} of {len(x)}")
        return tuple(x)
    return x, None


def split_pair(x) -> tuple:
    """``(data, sf)`` of an input that must be quantized (``cast_back``, ``per_block_cast_lossless``)."""
    if not isinstance(x, tuple):
        raise TypeError(f"x must be a quantized (data, sf) tuple, got {type(x).__name__}")
    if len(x) != 2:
        raise ValueError(f"x must be a quantized (data, sf) tuple, got a tuple of {len(x)}")
    return x


def join_quantized(data: torch.Tensor, sf: torch.Tensor | None):
    """The input as the dispatch code decodes it: a ``(data, sf)`` tuple, or the plain tensor."""
    return data if sf is None else (data, sf)


def check_fmt(fmt) -> None:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    validate_quant_fmt(fmt)


def check_matrix(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along the hidden dim, got strides {tuple(t.stride())}")
    if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        raise ValueError(f"{name} rows must not overlap, got strides {tuple(t.stride())}")
    check_kernel_extent(t, name)


def check_num_per_channels(value, name: str = "num_per_channels") -> int:
    return check_int_choice(value, name, NUM_PER_CHANNELS)


def check_same_device(t: torch.Tensor, name: str, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, but the input is on {device}")


def _check_block(block, name: str) -> tuple[int, int]:
    if not isinstance(block, tuple) or len(block) != 2:
        raise ValueError(f"{name} must be a tuple of two positive ints, got {block!r}")
    # The kernels take block sizes as int32 constants.
    return tuple(check_int(b, f"{name}[{i}]", 1, INT32_MAX) for i, b in enumerate(block))


def sf_layout_of(sf: torch.Tensor, flavor: Flavor, block_k: int, name: str) -> SFLayout:
    """The layout of a given SF tensor, from its dtype and strides."""
    if sf.dtype == torch.float32:
        kind = "fp32"
    elif sf.dtype == torch.float8_e4m3fn:
        kind = "e4m3"
    elif sf.dtype == flavor.ue8m0_word_dtype:
        kind = "ue8m0"
    else:
        raise TypeError(f"{name} must be float32, float8_e4m3fn or packed UE8M0 {flavor.ue8m0_word_dtype} "
                        f"(the {flavor.name} flavor's word), got {sf.dtype}")
    if sf.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(sf.shape)}")
    col_major = sf.stride(0) == 1 and sf.stride(1) != 1
    if not col_major and sf.shape[1] > 1 and sf.stride(1) != 1:
        raise ValueError(f"{name} must be row-major or column-major, got strides {tuple(sf.stride())}")
    packed = kind == "ue8m0"
    if packed and block_k == 1 and col_major:
        raise ValueError(f"{name}: an SF packed along tokens cannot be column-major")
    return SFLayout.of(flavor, packed=packed, e4m3=kind == "e4m3", col_major=col_major, block_k=block_k)


def decode_input(x, x_block_size, flavor: Flavor) -> CastInput:
    """A plain bf16/fp32 matrix, or a pre-quantized ``(data, sf)`` tuple with ``x_block_size``."""
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ValueError(f"a quantized x must be a (data, sf) tuple, got {len(x)} elements")
        data, sf = x
        check_matrix(data, "x data")
        if data.dtype not in QUANT_DTYPES:
            raise TypeError(f"x data must be float8_e4m3fn or int8 (packed FP4), got {data.dtype}")
        if x_block_size is None:
            raise ValueError("x_block_size is required when x is a (data, sf) tuple")
        bm, bk = _check_block(x_block_size, "x_block_size")
        fmt = QUANT_DTYPES[data.dtype]
        if not isinstance(sf, torch.Tensor):
            raise TypeError(f"x sf must be a torch.Tensor, got {type(sf).__name__}")
        check_same_device(sf, "x sf", data.device)
        layout = sf_layout_of(sf, flavor, bk, "x sf")
        m, k = data.shape[0], logical_cols(fmt, data.shape[1])
        layout.check(sf, ceil_div(m, bm), ceil_div(k, bk), "x sf")
        return CastInput(data, fmt, m, k, sf, layout, (bm, bk))
    check_matrix(x, "x")
    if x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32 (or a (data, sf) tuple), got {x.dtype}")
    if x_block_size is not None:
        raise ValueError("x_block_size must be None when x is a plain tensor")
    return CastInput(x, PLAIN_DTYPES[x.dtype], x.shape[0], x.shape[1])


def check_sf_options(round_sf: bool, use_packed_ue8m0: bool, use_e4m3_sf: bool) -> None:
    for name, value in (("round_sf", round_sf), ("use_packed_ue8m0", use_packed_ue8m0),
                        ("use_e4m3_sf", use_e4m3_sf)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    if use_packed_ue8m0 and not round_sf:
        raise ValueError("use_packed_ue8m0 requires round_sf=True (packed UE8M0 holds powers of two)")
    if round_sf and use_e4m3_sf:
        raise ValueError("round_sf and use_e4m3_sf are exclusive (power-of-two SF vs E4M3 SF)")


def check_out_data(out_x, fmt: str, num_tokens: int, hidden: int, device: torch.device) -> None:
    check_matrix(out_x, "out data")
    expected = (num_tokens, physical_cols(fmt, hidden))
    if out_x.dtype != OUT_DTYPES[fmt]:
        raise TypeError(f"out data must have dtype {OUT_DTYPES[fmt]} for fmt {fmt!r}, got {out_x.dtype}")
    if tuple(out_x.shape) != expected:
        raise ValueError(f"out data must have shape {expected}, got {tuple(out_x.shape)}")
    check_same_device(out_x, "out data", device)


def expert_starts(psum: torch.Tensor, alignment: int) -> torch.Tensor:
    """The first row of each expert in the psum layout: 0, then ``align(psum[e - 1], alignment)``."""
    aligned = (psum[:-1].long() + alignment - 1) // alignment * alignment
    return torch.cat([aligned.new_zeros(1), aligned])


def check_psum(psum, name: str, num_rows: int, device: torch.device) -> torch.Tensor:
    """Check a psum layout ``psum[e]`` = end of expert ``e``'s rows (quant-b spec §0.5).

    A non-empty contiguous 1-D int32 tensor on ``device`` with ``0 <= psum[0]``, ends that do not
    decrease and ``psum[-1] <= num_rows``. An expert whose end lies before its aligned start
    (``psum[e] < align(psum[e - 1])``) owns no row, as in TileKernels. The values are read (not
    when traced), so a bad layout is a ValueError before any kernel runs.
    """
    check_tensor(psum, name, dtype=torch.int32, dim=1, device=device, contiguous=True)
    if psum.numel() == 0:
        raise ValueError(f"{name} must hold at least one expert (an empty psum marks no row valid)")
    if not is_traced(psum):
        # One read into a list: a few torch ops on a handful of experts cost more than the loop.
        with_values(psum, functools.partial(_check_psum_values, name=name, num_rows=num_rows))
    return psum


def _check_psum_values(values: list[int], name: str, num_rows: int) -> None:
    if values[0] < 0:
        raise ValueError(f"{name}[0] must be >= 0, got {values[0]}")
    for e in range(1, len(values)):
        if values[e] < values[e - 1]:
            raise ValueError(f"{name} must not decrease: {name}[{e}] = {values[e]} is below "
                             f"{name}[{e - 1}] = {values[e - 1]}")
    if values[-1] > num_rows:
        raise ValueError(f"{name}[-1] = {values[-1]} exceeds the number of rows, {num_rows}")


def padding_ranges(ends: list[int], num_rows: int, alignment: int) -> list[tuple[int, int]]:
    """The row ranges of ``num_rows`` rows that belong to no expert in the psum layout ``ends``
    (the rows ``expert_rows`` marks False), in order: expert ``e`` owns ``[start_e, ends[e])``, and
    these ranges ascend, so the padding is what lies between them and after the last."""
    ranges, covered, start = [], 0, 0
    for end in ends:
        if end > start:
            if start > covered:
                ranges.append((covered, start))
            covered = end
        start = align(end, alignment)
    if covered < num_rows:
        ranges.append((covered, num_rows))
    return ranges


def expert_rows(psum: torch.Tensor | None, num_rows: int, alignment: int) -> torch.Tensor:
    """Which of ``num_rows`` rows belong to an expert in the psum layout (a bool tensor on psum's
    device): expert ``e`` owns rows ``[start_e, psum[e])``, ``start_0 = 0``,
    ``start_e = align(psum[e - 1], alignment)``; the rows between an expert's end and the next
    start, and those from ``align(psum[-1])`` on, are padding. Without psum every row is valid."""
    if psum is None:
        return torch.ones(num_rows, dtype=torch.bool)
    rows = torch.arange(num_rows, device=psum.device)
    ends = psum.long()
    expert = torch.searchsorted(ends, rows, right=True)
    inside = expert < ends.numel()
    starts = expert_starts(ends, alignment)
    return inside & (rows >= starts[expert.clamp(max=ends.numel() - 1)])
