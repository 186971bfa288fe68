"""``cast_back`` and ``per_token_cast_back``: public dispatch (validation, allocation, backend choice).

Dequantizes a quantized ``(data, sf)`` pair to bf16 or fp32:
``out = convert(fl32(float(q) * sf))``. Names and parameters follow TileKernels v2;
``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_int
from vmi_core.library import KernelOp, Param
from vmi_core.targets import resolve_flavor, resolve_target

from . import cast_back_parallel as parallel
from . import reference
from .inputs import decode_input

OUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class CastBackCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.CastBackSpec
    data: torch.Tensor
    sf: torch.Tensor
    out: torch.Tensor


def check_num_per_channels(num_per_channels) -> None:
    check_int(num_per_channels, "num_per_channels", 1, INT32_MAX)


def _prepare(x, fmt, x_block_size, x_special_fmt, target, flavor):
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt not in OUT_DTYPES:
        raise ValueError(f"fmt must be one of {tuple(OUT_DTYPES)}, got {fmt!r}")
    if x_special_fmt is not None:
        raise ValueError(f"x_special_fmt must be None (no special input format is supported), got {x_special_fmt!r}")
    if not isinstance(x, tuple):
        raise TypeError(f"x must be a quantized (data, sf) tuple, got {type(x).__name__}")
    if not x or not isinstance(x[0], torch.Tensor):
        raise TypeError("x must be a (data, sf) tuple whose data is a torch.Tensor")
    target = resolve_target(x[0], target)
    flavor = resolve_flavor(target, flavor)
    inp = decode_input(x, x_block_size, flavor)
    bm, bk = inp.block_size
    if inp.hidden % 64:
        raise ValueError(f"the hidden size of x must be a multiple of 64, got {inp.hidden}")
    if bk == 1 and inp.sf_layout.col_major:
        raise ValueError("x sf must be row-major when x_block_size[1] == 1 (column-major SF is not supported there)")
    spec = parallel.CastBackSpec(inp.fmt, fmt, inp.sf_layout, bm, bk)
    out = torch.empty((inp.num_tokens, inp.hidden), dtype=OUT_DTYPES[fmt], device=inp.data.device)
    return target, flavor, CastBackCall(spec, inp.data, inp.sf, out)


def _run(data, sf, fmt, x_block_size, x_special_fmt, *, out, target, flavor, launch):
    x = (data, sf)
    target, flavor, call = _prepare(x, fmt, x_block_size, x_special_fmt, target, flavor)
    if launch and target == "torch":
        call.out.copy_(reference.cast_back(x, fmt, x_block_size, flavor=flavor))
    elif launch:
        parallel.launch(call, target)
    return call.out


CAST_BACK = KernelOp("cast_back", (Param("x_data", "Tensor"), Param("x_sf", "Tensor"), Param("fmt", "str"),
                                   Param("x_block_size", "int[]"), Param("x_special_fmt", "str", None, optional=True)),
                     ("out",), _run)


def _split(x) -> tuple:
    if not isinstance(x, tuple):
        raise TypeError(f"x must be a quantized (data, sf) tuple, got {type(x).__name__}")
    if len(x) != 2:
        raise ValueError(f"x must be a quantized (data, sf) tuple, got a tuple of {len(x)}")
    return x


def cast_back(x, fmt: str, x_block_size, x_special_fmt=None, *, target: str | None = None,
              flavor: str | None = None) -> torch.Tensor:
    """Dequantize ``x = (data, sf)`` to ``fmt`` (``"bf16"`` or ``"fp32"``); returns ``(M, K)``.

    ``data``: E4M3 ``(M, K)`` or FP4 int8 ``(M, K/2)`` (``K % 64 == 0``); ``sf``: fp32,
    E4M3 or the flavor's packed UE8M0 words over ``x_block_size = (bm, bk)`` blocks,
    row- or column-major (row-major when ``bk == 1``; packed along tokens then).
    """
    return CAST_BACK(*_split(x), fmt, x_block_size, x_special_fmt, target=target, flavor=flavor)


def per_token_cast_back(x, fmt: str, num_per_channels: int, x_special_fmt=None, *, target: str | None = None,
                        flavor: str | None = None) -> torch.Tensor:
    """``cast_back(x, fmt, (1, num_per_channels), x_special_fmt)``."""
    check_num_per_channels(num_per_channels)
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt, target=target, flavor=flavor)
