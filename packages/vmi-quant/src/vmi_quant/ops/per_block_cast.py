"""``per_block_cast`` family: public dispatch (validation, allocation, backend choice).

Quantizes a bf16/fp32 matrix to E4M3 or FP4 (E2M1) with one scaling factor per
``bm x bk`` block (``bm, bk`` in {32, 128}). Names and parameters follow TileKernels
v2; ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_quant.sf_layout import SFLayout

from .. import reference
from ..config import get_amax_clamp_for_quant
from ..inputs import (
    OUT_DTYPES,
    PLAIN_DTYPES,
    check_fmt,
    check_matrix,
    check_out_data,
    check_same_device,
    physical_cols,
    sf_layout_of,
)
from ..kernels import per_block_cast as parallel
from ..kernels.common import ScaleRule
from ..options import SFOptions
from . import demo
from .per_token_cast import SF_FLAGS

_NAMES = {"cast": "per_block_cast", "sf_only": "per_block_cast_with_sf_only",
          "cast_only": "per_block_cast_with_precomputed_sf"}


@dataclass(frozen=True)
class PerBlockCastOptions:
    """The validated options of one ``per_block_cast`` call (everything but the tensors and the target).

    ``mode``: ``"cast"``, ``"sf_only"`` or ``"cast_only"`` (data from a given SF). The SF is
    never E4M3 here (``sf.use_e4m3_sf`` is False).
    """

    fmt: str
    block_size: tuple[int, int]
    sf: SFOptions = SFOptions()
    mode: str = "cast"

    def __post_init__(self) -> None:
        check_fmt(self.fmt)
        if self.mode not in _NAMES:
            raise ValueError(f"mode must be one of {tuple(_NAMES)}, got {self.mode!r}")
        check_block_size(self.block_size)
        if not isinstance(self.sf, SFOptions):
            raise TypeError(f"sf must be an SFOptions, got {type(self.sf).__name__}")
        if self.sf.use_e4m3_sf:
            raise ValueError("per_block_cast has no E4M3 SF (use_e4m3_sf must be False)")
        if self.mode == "cast_only" and (self.sf.use_packed_ue8m0 or self.sf.use_tma_aligned_col_major_sf):
            raise ValueError("a precomputed sf must be row-major and unpacked: pass "
                             "use_packed_ue8m0=False and use_tma_aligned_col_major_sf=False")


@dataclass
class PerBlockCastCall:
    """A validated call: its options, the kernel specialisation and the tensors it reads and writes."""

    options: PerBlockCastOptions
    spec: parallel.PerBlockCastSpec
    x: torch.Tensor
    flavor: Flavor
    out: torch.Tensor | None
    sf: torch.Tensor


def check_block_size(block_size) -> tuple[int, int]:
    if (not isinstance(block_size, tuple) or len(block_size) != 2
            or not all(type(b) is int and b in parallel.BLOCK_SIZES for b in block_size)):
        raise ValueError(f"block_size must be a tuple (bm, bk) with bm and bk in {parallel.BLOCK_SIZES}, "
                         f"got {block_size!r}")
    return block_size


def make_spec(in_fmt: str, fmt: str, block_size: tuple[int, int], mode: str, sf_layout: SFLayout,
              round_sf: bool) -> parallel.PerBlockCastSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now)."""
    # A precomputed SF is only read (sf_inv = 1/sf), so round_sf does not change that kernel.
    rule = ScaleRule(fmt, get_amax_clamp_for_quant(fmt, False), round_sf=round_sf and mode != "cast_only",
                     stored=sf_layout.kind)
    return parallel.PerBlockCastSpec(in_fmt, fmt, *block_size, mode, rule, sf_layout)


def _prepare(options: PerBlockCastOptions, x, out, sf, target, flavor) -> tuple[str, PerBlockCastCall]:
    mode, fmt = options.mode, options.fmt
    given_out, given_sf = out, sf
    if isinstance(x, tuple):
        raise TypeError(f"{_NAMES[mode]} needs a plain bf16/fp32 x, not a quantized (data, sf) tuple")
    check_matrix(x, "x")
    if x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    device = x.device
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    bm, bk = options.block_size
    num_tokens, hidden = x.shape
    if num_tokens % parallel.ALIGN or hidden % parallel.ALIGN:
        raise ValueError(f"x must have a number of tokens and a hidden size that are multiples of "
                         f"{parallel.ALIGN}, got shape {tuple(x.shape)}")

    nbm, nbk = num_tokens // bm, hidden // bk
    layout = options.sf.layout(flavor, block_k=bk)
    if mode == "cast_only":
        if not isinstance(sf, torch.Tensor):
            raise TypeError(f"sf must be a torch.Tensor, got {type(sf).__name__}")
        check_same_device(sf, "sf", device)
        layout = sf_layout_of(sf, flavor, bk, "sf")
        if layout.kind != "fp32":
            raise TypeError(f"sf must be float32, got {sf.dtype}")
        layout.check(sf, nbm, nbk, "sf")
        if layout.col_major:
            raise ValueError(f"sf must be row-major, got strides {tuple(sf.stride())}")
    elif sf is not None:
        layout.check(sf, nbm, nbk, "out_sf", writable=True)
        check_same_device(sf, "out_sf", device)
    else:
        sf = layout.allocate(nbm, nbk, flavor, device)

    if mode != "sf_only":
        if out is None:
            out = torch.empty((num_tokens, physical_cols(fmt, hidden)), dtype=OUT_DTYPES[fmt], device=device)
        else:
            check_out_data(out, fmt, num_tokens, hidden, device)

    check_disjoint({"out data": given_out, "out_sf": None if mode == "cast_only" else given_sf},
                   {"x": x, "sf": sf if mode == "cast_only" else None})
    spec = make_spec(PLAIN_DTYPES[x.dtype], fmt, (bm, bk), mode, layout, options.sf.round_sf)
    return target, PerBlockCastCall(options, spec, x, flavor, out, sf)


def _reference(call: PerBlockCastCall):
    options = call.options
    block = options.block_size
    if options.mode == "cast_only":
        return call.out.copy_(reference.cast(call.x, options.fmt, block, sf=call.sf, flavor=call.flavor))
    sf = options.sf
    data, out_sf = reference.cast(call.x, options.fmt, block, round_sf=sf.round_sf,
                                  use_tma_aligned_col_major_sf=sf.use_tma_aligned_col_major_sf,
                                  use_packed_ue8m0=sf.use_packed_ue8m0, flavor=call.flavor)
    call.sf.copy_(out_sf)
    if options.mode == "sf_only":
        return call.sf
    call.out.copy_(data)
    return call.out, call.sf


def _execute(options: PerBlockCastOptions, x, out, sf, target, flavor, launch) -> PerBlockCastCall:
    target, call = _prepare(options, x, out, sf, target, flavor)
    if launch and target == "torch":
        _reference(call)
    elif launch:
        parallel.launch(call, target)
    return call


def _options(mode, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) -> PerBlockCastOptions:
    return PerBlockCastOptions(fmt, block_size, SFOptions(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0),
                               mode)


def _run_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, *, out, target, flavor,
              launch):
    options = _options("cast", fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    out_data, out_sf = out or (None, None)
    call = _execute(options, x, out_data, out_sf, target, flavor, launch)
    return call.out, call.sf


def _run_sf_only(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, *, out, target,
                 flavor, launch):
    options = _options("sf_only", fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _execute(options, x, None, out and out[0], target, flavor, launch).sf


def _run_precomputed_sf(x, fmt, block_size, sf, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, *, out,
                        target, flavor, launch):
    options = _options("cast_only", fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _execute(options, x, out and out[0], sf, target, flavor, launch).out


_X_FMT_BLOCK = (Param("x", "Tensor"), Param("fmt", "str"), Param("block_size", "int[]"))
_SF_FLAGS = SF_FLAGS[:3]

_OPTIONS = (
    Option("fmt", "e4m3", ("e4m3", "e2m1"), "output format"),
    Option("block_m", 128, (32, 128), "tokens per scaling block"),
    Option("block_k", 128, (32, 128), "channels per scaling block"),
    Option("in_dtype", "bf16", tuple(demo.IN_DTYPES), "input dtype"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
)
_DEFAULT_SHAPE = (1024, 4096)


def _block_size(options) -> tuple[int, int]:
    return options["block_m"], options["block_k"]


def _kernels(options, target, flavor):
    x = demo.meta(_DEFAULT_SHAPE, demo.IN_DTYPES[options["in_dtype"]])
    cast = _options("cast", options["fmt"], _block_size(options), options["use_tma_aligned_col_major_sf"],
                    options["round_sf"], options["use_packed_ue8m0"])
    _, call = _prepare(cast, x, None, None, target, flavor)
    return [(parallel.build_per_block_cast, call.spec)]


PER_BLOCK_CAST = KernelOp(
    "per_block_cast", (*_X_FMT_BLOCK, *_SF_FLAGS), ("data", "sf"), _run_cast, outs=("out_data", "out_sf"),
    command=Command(
        summary="per-block (bm x bk) FP8 (E4M3) / FP4 (E2M1) quantization with block scaling factors",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=demo.BLOCK_BENCH_SHAPES,
        make_inputs=demo.plain_inputs, kernels=_kernels, options=_OPTIONS,
        arguments=lambda inputs, options, flavor: {"block_size": _block_size(options)}))
PER_BLOCK_CAST_WITH_SF_ONLY = KernelOp("per_block_cast_with_sf_only", (*_X_FMT_BLOCK, *_SF_FLAGS), ("sf",),
                                       _run_sf_only, outs=("out_sf",))
PER_BLOCK_CAST_WITH_PRECOMPUTED_SF = KernelOp(
    "per_block_cast_with_precomputed_sf", (*_X_FMT_BLOCK, Param("sf", "Tensor"), *_SF_FLAGS), ("data",),
    _run_precomputed_sf, outs=("out",))


def per_block_cast(x: torch.Tensor, fmt: str, block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                   round_sf: bool = False, use_packed_ue8m0: bool = False,
                   out: tuple[torch.Tensor | None, torch.Tensor | None] | None = None, *,
                   target: str | None = None, flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` with one scaling factor per ``block_size = (bm, bk)`` block.

    Each ``bm x bk`` block gets one scaling factor (SF) from its amax (clamped from below,
    see ``set_amax_clamp_for_quant``); the data are ``cast(x * sf_inv)``.

    Args:
        x: bf16/fp32 ``(M, K)`` with ``M`` and ``K`` multiples of 128, unit stride along
            ``K`` (the row stride may exceed ``K``). Not a ``(data, sf)`` tuple.
        fmt: Output format, ``"e4m3"`` or ``"e2m1"`` (FP4).
        block_size: ``(bm, bk)``, each 32 or 128.
        use_tma_aligned_col_major_sf: Return the SF as a column-major view, its storage rows
            padded as the flavor pads them (to 16 bytes for ``cuda``, unpadded for ``ascend``).
        round_sf: Round each scale up to a power of two.
        use_packed_ue8m0: Return the SF as packed UE8M0 exponent bytes in the flavor's words
            (needs ``round_sf``).
        out: Optional preallocated ``(data, sf)``, either entry None to allocate it; shapes,
            dtypes and SF layout as returned (rows may be padded). Must not share memory with
            ``x`` or with each other.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        data: ``torch.float8_e4m3fn`` ``(M, K)`` for ``"e4m3"``, or ``torch.int8`` ``(M, K/2)``
            with two FP4 codes per byte (even channel in the low nibble) for ``"e2m1"``.
        sf: The ``(M/bm, K/bk)`` grid: float32, or packed UE8M0 (``use_packed_ue8m0``) of
            shape ``(M/bm, ceil(K/bk / P))`` packed along the channels, int16 words of
            ``P = 2`` (``ascend`` flavor) or int32 words of ``P = 4`` (``cuda`` flavor).
            Row-major, or a column-major view with ``use_tma_aligned_col_major_sf``. With
            ``out``, the given tensors.

    Raises:
        TypeError: ``x`` is not a tensor (a ``(data, sf)`` tuple included) or not bf16/fp32;
            ``fmt`` is not a str; a flag is not a bool; an ``out`` entry has the wrong dtype;
            ``out`` is not a 2-tuple.
        ValueError: ``fmt`` is not ``"e4m3"``/``"e2m1"``; ``block_size`` is not a tuple of two
            ints in (32, 128); ``use_packed_ue8m0`` without ``round_sf``; ``x`` is not 2-D, has
            a non-unit stride along ``K`` or overlapping rows, is too large for 32-bit kernel
            offsets, or ``M`` or ``K`` is not a multiple of 128; an ``out`` entry has the
            wrong shape or device, or outputs overlap each other or ``x``.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return PER_BLOCK_CAST(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out=out,
                          target=target, flavor=flavor)


per_block_cast_parallel = parallel_entry(per_block_cast, "x")


def per_block_cast_with_sf_only(x: torch.Tensor, fmt: str, block_size: tuple[int, int],
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False, out_sf: torch.Tensor | None = None, *,
                                target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Only the SF ``per_block_cast`` would return (no data is written).

    Same arguments as ``per_block_cast`` except that the SF output is ``out_sf``.

    Args:
        out_sf: Optional preallocated SF in the layout the flags give (shape and dtype as
            returned; must not overlap ``x``).

    Returns:
        The SF of ``per_block_cast`` with the same flags (``out_sf`` when given).

    Raises:
        TypeError: As ``per_block_cast``.
        ValueError: As ``per_block_cast``.
    """
    return PER_BLOCK_CAST_WITH_SF_ONLY(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                                       out=None if out_sf is None else (out_sf,), target=target, flavor=flavor)


def per_block_cast_with_precomputed_sf(x: torch.Tensor, fmt: str, block_size: tuple[int, int], sf: torch.Tensor,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False, out: torch.Tensor | None = None, *,
                                       target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Quantize with a given SF: ``q = cast(x * (1 / sf))``; returns the data only.

    Same arguments as ``per_block_cast`` except that the SF is an input and ``out`` is the
    data alone. ``round_sf`` does not change the result (the given SF is used as is).

    Args:
        sf: Row-major float32 ``(M/bm, K/bk)`` SF on ``x``'s device.
        use_tma_aligned_col_major_sf: Must be False (a precomputed SF is row-major).
        use_packed_ue8m0: Must be False (a precomputed SF is unpacked).
        out: Optional preallocated data, shape and dtype as returned (rows may be padded).

    Returns:
        The data, as ``per_block_cast`` returns them (``out`` when given).

    Raises:
        TypeError: ``sf`` is not a float32 tensor; otherwise as ``per_block_cast``.
        ValueError: ``use_packed_ue8m0`` or ``use_tma_aligned_col_major_sf`` is True; ``sf``
            has the wrong shape or device or is not row-major; ``out`` overlaps ``x`` or
            ``sf``; otherwise as ``per_block_cast``.
    """
    return PER_BLOCK_CAST_WITH_PRECOMPUTED_SF(x, fmt, block_size, sf, use_tma_aligned_col_major_sf, round_sf,
                                              use_packed_ue8m0, out=None if out is None else (out,), target=target,
                                              flavor=flavor)
