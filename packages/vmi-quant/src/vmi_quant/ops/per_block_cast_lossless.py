"""``per_block_cast_lossless``: public dispatch (validation, allocation, backend choice).

Re-quantizes FP4 (E2M1) data with power-of-two scales per input block to E4M3 with one
power-of-two scale per larger output block, without changing any dequantized value.
Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import is_traced
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import randn
from vmi_quant.sf_layout import SFLayout, ceil_div

from ..inputs import check_matrix, check_same_device, logical_cols, sf_layout_of, split_pair
from ..kernels import per_block_cast_lossless as parallel
from ..options import SFOptions
from ..reference.cast import cast as reference_cast
from ..reference.lossless import check_power_of_two_sf, check_ue8m0_sf_bytes
from ..reference.lossless import per_block_cast_lossless as reference_lossless
from . import demo
from .per_token_cast import SF_FLAGS


@dataclass
class LosslessCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.LosslessSpec
    data: torch.Tensor
    in_sf: torch.Tensor
    flavor: Flavor
    out: torch.Tensor
    sf: torch.Tensor
    sf_options: SFOptions


def _check_block(block, name: str) -> tuple[int, int]:
    if (not isinstance(block, tuple) or len(block) != 2
            or not all(type(b) is int and 0 < b <= parallel.MAX_BLOCK and b & (b - 1) == 0 for b in block)):
        raise ValueError(f"{name} must be a tuple of two powers of two in [1, {parallel.MAX_BLOCK}], got {block!r}")
    return block


def make_spec(in_sf_layout: SFLayout, x_block_size: tuple[int, int], sf_layout: SFLayout,
              out_block_size: tuple[int, int]) -> parallel.LosslessSpec:
    return parallel.LosslessSpec(in_sf_layout, *x_block_size, sf_layout, *out_block_size)


def _prepare(x, fmt, x_block_size, out_block_size, sf_options: SFOptions, target,
             flavor) -> tuple[str, LosslessCall]:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' (only FP4 -> E4M3 is lossless), got {fmt!r}")
    data, in_sf = x
    check_matrix(data, "x data")
    if data.dtype != torch.int8:
        raise TypeError(f"x data must be int8 (packed FP4), got {data.dtype}")
    if not isinstance(in_sf, torch.Tensor):
        raise TypeError(f"x sf must be a torch.Tensor, got {type(in_sf).__name__}")
    device = data.device
    check_same_device(in_sf, "x sf", device)
    target = resolve_target(data, target)
    flavor = resolve_flavor(target, flavor)
    x_block = _check_block(x_block_size, "x_block_size")
    out_block = _check_block(out_block_size, "out_block_size")
    if out_block[0] % x_block[0] or out_block[1] % x_block[1]:
        raise ValueError(f"out_block_size {out_block} must be a multiple of x_block_size {x_block}")
    num_tokens, hidden = data.shape[0], logical_cols("e2m1", data.shape[1])
    if num_tokens % parallel.ALIGN or hidden % parallel.ALIGN:
        raise ValueError(f"x must have a number of tokens and a (logical) hidden size that are multiples of "
                         f"{parallel.ALIGN}, got {num_tokens} x {hidden}")

    in_layout = sf_layout_of(in_sf, flavor, x_block[1], "x sf")
    if in_layout.kind == "e4m3":
        raise TypeError("x sf must hold powers of two (float32 or packed UE8M0), not float8_e4m3fn")
    in_layout.check(in_sf, ceil_div(num_tokens, x_block[0]), ceil_div(hidden, x_block[1]), "x sf")
    # Only the exponent bits of an fp32 SF are used: reject what they cannot hold exactly
    # (a traced SF has no values; the real call checks them).
    if not is_traced(in_sf):
        check_power_of_two_sf(in_sf, "x sf")
        check_ue8m0_sf_bytes(in_sf, (num_tokens, hidden), x_block, flavor, "x sf")
    if sf_options.use_packed_ue8m0 and sf_options.use_tma_aligned_col_major_sf and out_block[1] == 1:
        raise ValueError("an SF packed along tokens (out_block_size[1] == 1) cannot be column-major")
    layout = sf_options.layout(flavor, block_k=out_block[1])
    sf = layout.allocate(ceil_div(num_tokens, out_block[0]), ceil_div(hidden, out_block[1]), flavor, device)
    out = torch.empty((num_tokens, hidden), dtype=torch.float8_e4m3fn, device=device)
    spec = make_spec(in_layout, x_block, layout, out_block)
    return target, LosslessCall(spec, data, in_sf, flavor, out, sf, sf_options)


def _run(data, sf, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, *,
         out, target, flavor, launch):
    x = (data, sf)
    sf_options = SFOptions(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    target, call = _prepare(x, fmt, x_block_size, out_block_size, sf_options, target, flavor)
    if launch and target == "torch":
        opts = call.sf_options
        out, sf = reference_lossless(x, fmt, x_block_size, out_block_size, opts.use_tma_aligned_col_major_sf,
                                     opts.round_sf, opts.use_packed_ue8m0, flavor=call.flavor)
        call.sf.copy_(sf)
        call.out.copy_(out)
    elif launch and not parallel.launch(call, target):
        raise ValueError("x is not losslessly representable: the SF exponents inside one output block span more "
                         "than 11 binades (or an SF is negative)")
    return call.out, call.sf


_POW2_BLOCK = (1, 2, 4, 8, 16, 32, 64, 128)
_OPTIONS = (
    Option("x_block_m", 1, _POW2_BLOCK, "tokens per input scaling block"),
    Option("x_block_k", 32, _POW2_BLOCK, "channels per input scaling block"),
    Option("out_block_m", 32, _POW2_BLOCK, "tokens per output scaling block"),
    Option("out_block_k", 32, _POW2_BLOCK, "channels per output scaling block"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 output scaling factors"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major output scaling factors"),
)


def _blocks(options):
    return (options["x_block_m"], options["x_block_k"]), (options["out_block_m"], options["out_block_k"])


def _inputs(shape, options, seed):
    # FP4 with fp32 power-of-two scales; every |x| >= max|x| / 2^9 keeps the block scales within
    # the 11 binades one output block can hold.
    x = randn(shape, seed)
    floor = x.abs().max() / 2**9 if x.numel() else 0.0
    x = torch.where(x.abs() < floor, torch.copysign(torch.full_like(x, float(floor)), x), x)
    data, sf = reference_cast(x, "e2m1", _blocks(options)[0], round_sf=True)
    return {"x_data": data, "x_sf": sf}


def _arguments(inputs, options, flavor):
    x_block, out_block = _blocks(options)
    return {"fmt": "e4m3", "x_block_size": x_block, "out_block_size": out_block, "round_sf": True}


def _kernels(options, target, flavor):
    # The specialisation does not depend on the shape: a small input gives it.
    inputs = demo.on_meta(_inputs((128, 128), options, 0))
    x_block, out_block = _blocks(options)
    sf_options = SFOptions(options["use_tma_aligned_col_major_sf"], True, options["use_packed_ue8m0"])
    _, call = _prepare((inputs["x_data"], inputs["x_sf"]), "e4m3", x_block, out_block, sf_options, target, flavor)
    return [(parallel.build_per_block_cast_lossless, call.spec)]


PER_BLOCK_CAST_LOSSLESS = KernelOp(
    "per_block_cast_lossless",
    (Param("x_data", "Tensor"), Param("x_sf", "Tensor"), Param("fmt", "str"), Param("x_block_size", "int[]"),
     Param("out_block_size", "int[]"), *SF_FLAGS[:3]),
    ("data", "sf"), _run,
    command=Command(
        summary="exact FP4 -> E4M3 re-quantization to larger scaling blocks",
        support=demo.PARALLEL_SUPPORT, default_shape=(1024, 4096), bench_shapes=demo.BLOCK_BENCH_SHAPES,
        make_inputs=_inputs, kernels=_kernels, options=_OPTIONS, arguments=_arguments))


def per_block_cast_lossless(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int],
                            out_block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                            round_sf: bool = False, use_packed_ue8m0: bool = False, *, target: str | None = None,
                            flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-quantize FP4 ``x = (data, sf)`` to E4M3 with larger blocks, exactly.

    Every dequantized value is kept: each output block gets one power-of-two scale, and its
    FP4 values are rescaled into E4M3 without rounding.

    Only the exponent bits of an fp32 ``sf`` are used, so every element must be a positive normal
    power of two (2^-126 .. 2^127, what UE8M0 bytes 1..254 decode to); any other value (a
    mantissa, a sign, 0.0, a subnormal, inf, NaN) raises ValueError naming ``x sf`` before any
    kernel runs (a one-pass check on the SF tensor); likewise a packed UE8M0 byte 0 (2^-127) or
    255 (NaN) among the bytes the blocks use.

    Args:
        x: ``(data, sf)``: packed FP4 int8 ``(M, K/2)`` data with ``M`` and ``K`` multiples of
            128 (unit inner stride, rows may be padded), and a float32 (powers of two) or
            packed UE8M0 (the flavor's words) SF over ``x_block_size`` blocks,
            ``(ceil(M/bm), ceil(K/bk))`` values, row- or column-major.
        fmt: Output format; must be ``"e4m3"``.
        x_block_size: ``(bm, bk)`` of the input SF, powers of two up to 128.
        out_block_size: ``(bm, bk)`` of the output SF, powers of two up to 128, each a multiple
            of the matching ``x_block_size`` entry.
        use_tma_aligned_col_major_sf: Return the SF as a column-major view (storage padded as
            the flavor pads it); not with an SF packed along tokens.
        round_sf: Required by ``use_packed_ue8m0``; the output scales are powers of two either
            way.
        use_packed_ue8m0: Return the SF as packed UE8M0 exponent bytes in the flavor's words.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of the
            op's leading tensor.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        data: New ``torch.float8_e4m3fn`` ``(M, K)``.
        sf: The ``(ceil(M/bm), ceil(K/bk))`` output grid (``out_block_size``): float32 powers
            of two, or packed UE8M0 (``use_packed_ue8m0``): int16 words of 2 (``ascend``
            flavor) or int32 words of 4 (``cuda`` flavor), packed along the channels (along
            the tokens when ``bk == 1``). Row-major, or a column-major view with
            ``use_tma_aligned_col_major_sf``.

    Raises:
        TypeError: ``x`` is not a tuple; ``fmt`` is not a str; the data is not int8; the SF
            is not a tensor, is float8_e4m3fn, or is not float32 or the flavor's UE8M0 word;
            a flag is not a bool.
        ValueError: Before any kernel: ``x`` is a tuple of other than two; ``fmt`` is not
            ``"e4m3"``; a block size is not a tuple of two powers of two in [1, 128], or
            ``out_block_size`` is not a multiple of ``x_block_size``; ``use_packed_ue8m0``
            without ``round_sf``; packed, column-major and ``out_block_size[1] == 1``; the data
            is not 2-D, has a non-unit inner stride or overlapping rows, is too large for 32-bit
            kernel offsets, or ``M`` or ``K`` is not a multiple of 128; the SF has the wrong
            shape, layout or device, an fp32 SF holds a value that is not a positive normal
            power of two, or a packed SF a byte 0 or 255.
        ValueError: After the kernel ran: ``x`` is not losslessly representable (the SF
            exponents inside one output block span more than 11 binades).
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return PER_BLOCK_CAST_LOSSLESS(*split_pair(x), fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf,
                                   round_sf, use_packed_ue8m0, target=target, flavor=flavor)


per_block_cast_lossless_parallel = parallel_entry(per_block_cast_lossless, "x")
