"""``cast_back`` and ``per_token_cast_back``: public dispatch (validation, allocation, backend choice).

Dequantizes a quantized ``(data, sf)`` pair to bf16 or fp32:
``out = convert(fl32(float(q) * sf))``. Names and parameters follow TileKernels v2;
``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_int
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import randn

from .. import reference
from ..inputs import decode_input, split_pair
from ..kernels import cast_back as parallel
from . import demo

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


_OPTIONS = (
    Option("fmt", "bf16", ("bf16", "fp32"), "output format"),
    Option("x_fmt", "e4m3", ("e4m3", "e2m1"), "format of the quantized input"),
    Option("block_m", 1, help="tokens per scaling block"),
    Option("block_k", 32, help="channels per scaling block"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors (block_k > 1)"),
    Option("use_e4m3_sf", False, help="E4M3 scaling factors"),
)


_DEFAULT_SHAPE = (1024, 4096)


def _block(options) -> tuple[int, int]:
    return options["block_m"], options["block_k"]


def _inputs(shape, options, seed):
    # Quantized once per flavor (packed UE8M0 words differ); run and reference pick theirs.
    flags = ("round_sf", "use_packed_ue8m0", "use_tma_aligned_col_major_sf", "use_e4m3_sf")
    x = randn(shape, seed)
    return {flavor: reference.cast(x, options["x_fmt"], _block(options), flavor=flavor,
                                   **{k: options[k] for k in flags})
            for flavor in ("ascend", "cuda")}


def _arguments(inputs, options, flavor):
    data, sf = inputs[flavor]
    return {"x_data": data, "x_sf": sf, "x_block_size": _block(options)}


def _nbytes(inputs, outputs) -> int:
    return sum(t.numel() * t.element_size() for t in (*inputs["ascend"], *outputs))


def _kernels(options, target, flavor):
    x = demo.on_meta(_inputs(_DEFAULT_SHAPE, options, 0)[flavor])
    _, _, call = _prepare(x, options["fmt"], _block(options), None, target, flavor)
    return [(parallel.build_cast_back, call.spec)]


CAST_BACK = KernelOp(
    "cast_back", (Param("x_data", "Tensor"), Param("x_sf", "Tensor"), Param("fmt", "str"),
                  Param("x_block_size", "int[]"), Param("x_special_fmt", "str", None, optional=True)),
    ("out",), _run,
    command=Command(
        summary="dequantization of E4M3 / FP4 data with block scaling factors to bf16 / fp32",
        support=support("SIMT and SIMD vector regions",
                        cpu="bit-exact against the reference in both flavors, every block and SF layout"),
        default_shape=_DEFAULT_SHAPE, bench_shapes=demo.BENCH_SHAPES, make_inputs=_inputs, kernels=_kernels,
        options=_OPTIONS, arguments=_arguments, nbytes=_nbytes, aliases=("per_token_cast_back",)))


def cast_back(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int],
              x_special_fmt: str | None = None, *, target: str | None = None,
              flavor: str | None = None) -> torch.Tensor:
    """Dequantize ``x = (data, sf)`` to ``fmt``: ``out = convert(fl32(float(q) * sf))``.

    The SF kind and layout are taken from the SF tensor's dtype and strides.

    Args:
        x: ``(data, sf)``: E4M3 ``(M, K)`` or packed FP4 int8 ``(M, K/2)`` data
            (``K % 64 == 0``, unit inner stride, rows may be padded), and an fp32, E4M3 or
            packed UE8M0 (the flavor's int16/int32 words) SF over ``x_block_size`` blocks:
            ``(ceil(M/bm), ceil(K/bk))`` values, row- or column-major (row-major when
            ``bk == 1``; packed words then pack along the tokens, else along the channels).
        fmt: Output format, ``"bf16"`` or ``"fp32"``.
        x_block_size: ``(bm, bk)``, the block of one SF value (positive ints).
        x_special_fmt: Must be None (no special input format is supported).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of the
            op's leading tensor.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        A new contiguous ``(M, K)`` tensor, bfloat16 (rounded to nearest even) or float32.

    Raises:
        TypeError: ``x`` is not a tuple; ``fmt`` is not a str; the data is not a tensor or not
            float8_e4m3fn/int8; the SF is not a tensor or not float32, float8_e4m3fn or the
            flavor's packed UE8M0 word.
        ValueError: ``x`` is not a 2-tuple; ``fmt`` is not ``"bf16"``/``"fp32"``;
            ``x_special_fmt`` is not None; the data is not 2-D, has a non-unit inner stride or
            overlapping rows, or is too large for 32-bit kernel offsets; ``K`` is not a
            multiple of 64; the SF has the wrong shape, is neither row- nor column-major, or
            is column-major with ``bk == 1``, or on another device than the data.
        ValueError: ``x_block_size`` is not a tuple of two positive ints.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return CAST_BACK(*split_pair(x), fmt, x_block_size, x_special_fmt, target=target, flavor=flavor)


cast_back_parallel = parallel_entry(cast_back, "x")


def per_token_cast_back(x: tuple[torch.Tensor, torch.Tensor], fmt: str, num_per_channels: int,
                        x_special_fmt: str | None = None, *, target: str | None = None,
                        flavor: str | None = None) -> torch.Tensor:
    """``cast_back(x, fmt, (1, num_per_channels), x_special_fmt)``: the inverse of ``per_token_cast``.

    Same arguments as ``cast_back`` except ``num_per_channels`` for ``x_block_size``.

    Args:
        num_per_channels: Channels per SF value (the SF block is ``(1, num_per_channels)``);
            any int in ``[1, 2^31 - 1]``, as ``cast_back`` takes any block (TileKernels' CUDA
            kernel too). The casts that produce such tensors take 16..128: their limit is the
            quantizing kernels', not the format's.

    Returns:
        The ``(M, K)`` bf16 or fp32 tensor ``cast_back`` returns.

    Raises:
        TypeError: ``num_per_channels`` is not an int; otherwise as ``cast_back``.
        ValueError: ``num_per_channels`` is out of range; otherwise as ``cast_back``.
    """
    check_num_per_channels(num_per_channels)
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt, target=target, flavor=flavor)


per_token_cast_back_parallel = parallel_entry(per_token_cast_back, "x")
