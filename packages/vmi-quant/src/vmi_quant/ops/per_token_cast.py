"""``per_token_cast`` family: public dispatch (validation, allocation, backend choice).

Quantizes each token (row) in groups of ``num_per_channels`` channels to E4M3 or
FP4 (E2M1) with one scaling factor per group. Names and parameters follow
TileKernels v2; ``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_quant.sf_layout import SFLayout, ceil_div

from .. import reference
from ..config import get_amax_clamp_for_quant
from ..inputs import (
    OUT_DTYPES,
    CastInput,
    check_fmt,
    check_num_per_channels,
    check_out_data,
    check_same_device,
    decode_input,
    join_quantized,
    physical_cols,
    sf_layout_of,
    split_quantized,
)
from ..kernels import per_token_cast as parallel
from ..kernels.common import ScaleRule
from ..options import SFOptions
from . import demo

_MODES = ("cast", "sf_only", "cast_only")


@dataclass(frozen=True)
class PerTokenCastOptions:
    """The validated options of one ``per_token_cast`` call (everything but the tensors and the target).

    ``mode``: ``"cast"`` (data and SF), ``"sf_only"`` (the SF alone) or ``"cast_only"`` (data
    from a given SF). Building one checks every option, so the rest of the dispatch, the
    kernel spec and the reference read them as they are.
    """

    fmt: str
    num_per_channels: int
    x_block_size: tuple[int, int] | None = None
    sf: SFOptions = SFOptions()
    stochastic_cast: bool = False
    mode: str = "cast"

    def __post_init__(self) -> None:
        check_fmt(self.fmt)
        if not isinstance(self.sf, SFOptions):
            raise TypeError(f"sf must be an SFOptions, got {type(self.sf).__name__}")
        if not isinstance(self.stochastic_cast, bool):
            raise TypeError("stochastic_cast must be a bool")
        check_num_per_channels(self.num_per_channels)
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {self.mode!r}")
        if self.mode == "cast_only" and (self.sf.use_packed_ue8m0 or self.sf.use_tma_aligned_col_major_sf):
            raise ValueError("a precomputed sf must be row-major and unpacked: pass "
                             "use_packed_ue8m0=False and use_tma_aligned_col_major_sf=False")


@dataclass
class PerTokenCastCall:
    """A validated call: its options, the kernel specialisation and the tensors it reads and writes."""

    options: PerTokenCastOptions
    spec: parallel.PerTokenCastSpec
    inp: CastInput
    flavor: Flavor
    out: torch.Tensor | None
    sf: torch.Tensor


def _prepare(options: PerTokenCastOptions, x, out, sf, target, flavor) -> tuple[str, PerTokenCastCall]:
    mode, fmt, npc, sf_opts = options.mode, options.fmt, options.num_per_channels, options.sf
    given_out, given_sf = out, sf
    if mode != "cast" and isinstance(x, tuple):
        name = "per_token_cast_with_sf_only" if mode == "sf_only" else "per_token_cast_with_precomputed_sf"
        raise ValueError(f"{name} needs a plain bf16/fp32 x, not a quantized (data, sf) tuple")
    lead = x[0] if isinstance(x, tuple) and x else x
    if not isinstance(lead, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor or a (data, sf) tuple, got {type(x).__name__}")
    device = lead.device
    target = resolve_target(lead, target)
    flavor = resolve_flavor(target, flavor)
    inp = decode_input(x, options.x_block_size, flavor)
    if inp.hidden % 64:
        raise ValueError(f"the hidden size of x must be a multiple of 64, got {inp.hidden}")

    nbm, nbk = inp.num_tokens, ceil_div(inp.hidden, npc)
    layout = sf_opts.layout(flavor)
    if mode == "cast_only":
        if not isinstance(sf, torch.Tensor):
            raise TypeError(f"sf must be a torch.Tensor, got {type(sf).__name__}")
        check_same_device(sf, "sf", device)
        layout = sf_layout_of(sf, flavor, npc, "sf")
        e4m3_sf = sf_opts.use_e4m3_sf
        if layout.kind != ("e4m3" if e4m3_sf else "fp32"):
            raise TypeError(f"sf must be {'float8_e4m3fn' if e4m3_sf else 'float32'} "
                            f"with use_e4m3_sf={e4m3_sf}, got {sf.dtype}")
        layout.check(sf, nbm, nbk, "sf")
    elif sf is not None:
        layout.check(sf, nbm, nbk, "out_sf", writable=True)
        check_same_device(sf, "out_sf", device)
    else:
        sf = layout.allocate(nbm, nbk, flavor, device)

    if mode != "sf_only":
        if out is None:
            out = torch.empty((inp.num_tokens, physical_cols(fmt, inp.hidden)), dtype=OUT_DTYPES[fmt], device=device)
        else:
            check_out_data(out, fmt, inp.num_tokens, inp.hidden, device)

    check_disjoint({"out data": given_out, "out_sf": None if mode == "cast_only" else given_sf},
                   {"x data" if inp.sf is not None else "x": inp.data, "x sf": inp.sf,
                    "sf": sf if mode == "cast_only" else None})
    quant_input = None
    if inp.sf is not None:
        quant_input = parallel.QuantInput(inp.sf_layout, *inp.block_size, dequant_first=flavor.dequant_before_scale)
    spec = make_spec(inp.fmt, options, layout, quant_input)
    return target, PerTokenCastCall(options, spec, inp, flavor, out, sf)


def make_spec(in_fmt: str, options: PerTokenCastOptions, sf_layout: SFLayout,
              quant_input=None) -> parallel.PerTokenCastSpec:
    """The kernel specialisation of validated options (the amax clamp is read now)."""
    fmt, sf = options.fmt, options.sf
    # A precomputed SF is only read (sf_inv = 1/sf), so round_sf does not change that kernel.
    rule = ScaleRule(fmt, get_amax_clamp_for_quant(fmt, sf.use_e4m3_sf),
                     round_sf=sf.round_sf and options.mode != "cast_only", e4m3_sf=sf.use_e4m3_sf,
                     stored=sf_layout.kind)
    return parallel.PerTokenCastSpec(in_fmt, fmt, options.num_per_channels, options.mode, rule, sf_layout,
                                     options.stochastic_cast, quant_input)


def _reference(call: PerTokenCastCall, x):
    options = call.options
    sf = options.sf
    block = (1, options.num_per_channels)
    if options.mode == "cast_only":
        data = reference.cast(x, options.fmt, block, sf=call.sf, round_sf=sf.round_sf, use_e4m3_sf=sf.use_e4m3_sf,
                              flavor=call.flavor)
        return call.out.copy_(data)
    data, out_sf = reference.cast(x, options.fmt, block, x_block_size=call.inp.block_size, **sf.as_kwargs(),
                                  stochastic=options.stochastic_cast, flavor=call.flavor)
    call.sf.copy_(out_sf)
    if options.mode == "sf_only":
        return call.sf
    call.out.copy_(data)
    return call.out, call.sf


def _execute(options: PerTokenCastOptions, x, out, sf, target, flavor, launch) -> PerTokenCastCall:
    target, call = _prepare(options, x, out, sf, target, flavor)
    if launch and target == "torch":
        _reference(call, x)
    elif launch:
        parallel.launch(call, target)
    return call


def _run_cast(x, x_sf, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
              use_e4m3_sf, stochastic_cast, *, out, target, flavor, launch):
    options = PerTokenCastOptions(
        fmt, num_per_channels, x_block_size,
        SFOptions(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf), stochastic_cast)
    out_data, out_sf = out or (None, None)
    call = _execute(options, join_quantized(x, x_sf), out_data, out_sf, target, flavor, launch)
    return call.out, call.sf


def _run_sf_only(x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, *,
                 out, target, flavor, launch):
    options = PerTokenCastOptions(
        fmt, num_per_channels, sf=SFOptions(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf),
        mode="sf_only")
    return _execute(options, x, None, out and out[0], target, flavor, launch).sf


def _run_precomputed_sf(x, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                        use_e4m3_sf, *, out, target, flavor, launch):
    options = PerTokenCastOptions(
        fmt, num_per_channels, sf=SFOptions(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf),
        mode="cast_only")
    return _execute(options, x, out and out[0], sf, target, flavor, launch).out


_X = Param("x", "Tensor")
_FMT_AND_GROUP = (Param("fmt", "str"), Param("num_per_channels", "int"))
SF_FLAGS = (Param("use_tma_aligned_col_major_sf", "bool", False), Param("round_sf", "bool", False),
            Param("use_packed_ue8m0", "bool", False), Param("use_e4m3_sf", "bool", False))

_OPTIONS = (
    Option("fmt", "e4m3", ("e4m3", "e2m1"), "output format"),
    Option("num_per_channels", 32, (16, 32, 64, 128), "channels per scaling factor"),
    Option("in_dtype", "bf16", tuple(demo.IN_DTYPES), "input dtype"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
    Option("use_e4m3_sf", False, help="E4M3 scaling factors"),
    Option("stochastic_cast", False, help="stochastic rounding of the data"),
)
_DEFAULT_SHAPE = (1024, 4096)


def _kernels(options, target, flavor):
    x = demo.meta(_DEFAULT_SHAPE, demo.IN_DTYPES[options["in_dtype"]])
    sf = SFOptions(options["use_tma_aligned_col_major_sf"], options["round_sf"], options["use_packed_ue8m0"],
                   options["use_e4m3_sf"])
    cast = PerTokenCastOptions(options["fmt"], options["num_per_channels"], sf=sf,
                               stochastic_cast=options["stochastic_cast"])
    _, call = _prepare(cast, x, None, None, target, flavor)
    return [(parallel.build_per_token_cast, call.spec)]


PER_TOKEN_CAST = KernelOp(
    "per_token_cast",
    (_X, Param("x_sf", "Tensor", optional=True), *_FMT_AND_GROUP, Param("x_block_size", "int[]", None, optional=True),
     *SF_FLAGS, Param("stochastic_cast", "bool", False)),
    ("data", "sf"), _run_cast, outs=("out_data", "out_sf"),
    command=Command(
        summary="per-token FP8 (E4M3) / FP4 (E2M1) quantization with per-group scaling factors",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=demo.BENCH_SHAPES,
        make_inputs=demo.plain_inputs, kernels=_kernels, options=_OPTIONS))
PER_TOKEN_CAST_WITH_SF_ONLY = KernelOp(
    "per_token_cast_with_sf_only", (_X, *_FMT_AND_GROUP, *SF_FLAGS), ("sf",), _run_sf_only, outs=("out_sf",))
PER_TOKEN_CAST_WITH_PRECOMPUTED_SF = KernelOp(
    "per_token_cast_with_precomputed_sf", (_X, *_FMT_AND_GROUP, Param("sf", "Tensor"), *SF_FLAGS), ("data",),
    _run_precomputed_sf, outs=("out",))


def per_token_cast(x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], fmt: str, num_per_channels: int,
                   x_block_size: tuple[int, int] | None = None, use_tma_aligned_col_major_sf: bool = False,
                   round_sf: bool = False, use_packed_ue8m0: bool = False, use_e4m3_sf: bool = False,
                   stochastic_cast: bool = False,
                   out: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
                   *, target: str | None = None, flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize every token (row) in groups of ``num_per_channels`` channels.

    Each group of ``num_per_channels`` consecutive channels of a token gets one scaling factor
    (SF) from its amax (clamped from below, see ``set_amax_clamp_for_quant``); the data are
    ``cast(x * sf_inv)``.
    A pre-quantized input is dequantized with its own SF first (in the flavor's
    multiplication order).

    Args:
        x: bf16/fp32 ``(M, K)`` with ``K`` a multiple of 64 and unit stride along ``K`` (the
            row stride may exceed ``K``), or a pre-quantized ``(data, sf)`` tuple: E4M3
            ``(M, K)`` or packed FP4 int8 ``(M, K/2)`` data with an fp32, E4M3 or packed UE8M0
            SF (the flavor's word) over ``x_block_size`` blocks, row- or column-major.
        fmt: Output format, ``"e4m3"`` or ``"e2m1"`` (FP4).
        num_per_channels: Channels per group: 16, 32, 64 or 128.
        x_block_size: ``(bm, bk)`` block of a pre-quantized ``x``'s SF (positive ints); None
            for a plain ``x``.
        use_tma_aligned_col_major_sf: Return the SF as a column-major view (strides
            ``(1, M')``), its storage rows padded as the flavor pads them (``M'``: ``M`` rounded
            up to 16 bytes for ``cuda``, unpadded for ``ascend``).
        round_sf: Round each scale up to a power of two.
        use_packed_ue8m0: Return the SF as packed UE8M0 exponent bytes in the flavor's words
            (needs ``round_sf``).
        use_e4m3_sf: Store the SF as E4M3 (exclusive with ``round_sf``).
        stochastic_cast: Round the data stochastically (vmi-core's hash-based rule).
        out: Optional preallocated ``(data, sf)``, either entry None to allocate it; shapes,
            dtypes and SF layout as returned (rows may be padded). Must not share memory with
            ``x`` or with each other.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        data: ``torch.float8_e4m3fn`` ``(M, K)`` for ``"e4m3"``, or ``torch.int8`` ``(M, K/2)``
            with two FP4 codes per byte (even channel in the low nibble) for ``"e2m1"``.
        sf: The ``(M, ceil(K / num_per_channels))`` grid: float32, ``float8_e4m3fn``
            (``use_e4m3_sf``), or packed UE8M0 (``use_packed_ue8m0``) of shape
            ``(M, ceil(ceil(K / num_per_channels) / P))`` packed along the channels, int16 words
            of ``P = 2`` (``ascend`` flavor) or int32 words of ``P = 4`` (``cuda`` flavor).
            Row-major, or a column-major view with ``use_tma_aligned_col_major_sf``. With
            ``out``, the given tensors.

    Raises:
        TypeError: ``x`` is not a tensor or a ``(data, sf)`` tuple; ``fmt`` is not a str; a
            flag is not a bool; ``num_per_channels`` is not an int; a tensor (``x``, its data
            or SF, an ``out`` entry) has the wrong dtype; ``out`` is not a 2-tuple.
        ValueError: ``fmt`` is not ``"e4m3"``/``"e2m1"``; ``num_per_channels`` is not 16, 32,
            64 or 128; ``x_block_size`` is missing for a tuple ``x``, given for a plain one, or
            not a tuple of two positive ints; ``x``'s SF has the wrong shape or layout;
            ``use_packed_ue8m0`` without ``round_sf``, or ``round_sf`` with ``use_e4m3_sf``;
            an ``out`` entry has the wrong shape or device, or outputs overlap each other or
            ``x``.
        ValueError: ``x`` (or its data) is not 2-D, has a non-unit stride along the hidden
            dim or overlapping rows, or is too large for 32-bit kernel offsets; ``K`` is not a
            multiple of 64.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return PER_TOKEN_CAST(*split_quantized(x), fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                          round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic_cast, out=out, target=target,
                          flavor=flavor)


per_token_cast_parallel = parallel_entry(per_token_cast, "x")


def per_token_cast_with_sf_only(x: torch.Tensor, fmt: str, num_per_channels: int,
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False, use_e4m3_sf: bool = False,
                                out_sf: torch.Tensor | None = None,
                                *, target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Only the SF ``per_token_cast`` would return (no data is written).

    Same arguments as ``per_token_cast`` except that ``x`` must be a plain tensor (no
    ``x_block_size``, no ``stochastic_cast``) and the SF output is ``out_sf``.

    Args:
        x: bf16/fp32 ``(M, K)``, ``K`` a multiple of 64, unit stride along ``K`` (not a
            ``(data, sf)`` tuple).
        out_sf: Optional preallocated SF in the layout the flags give (shape and dtype as
            returned; must not overlap ``x``).

    Returns:
        The SF of ``per_token_cast`` with the same flags (``out_sf`` when given).

    Raises:
        TypeError: As ``per_token_cast``.
        ValueError: ``x`` is a ``(data, sf)`` tuple; otherwise as ``per_token_cast``.
    """
    return PER_TOKEN_CAST_WITH_SF_ONLY(x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
                                       use_packed_ue8m0, use_e4m3_sf, out=None if out_sf is None else (out_sf,),
                                       target=target, flavor=flavor)


def per_token_cast_with_precomputed_sf(x: torch.Tensor, fmt: str, num_per_channels: int, sf: torch.Tensor,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False, use_e4m3_sf: bool = False,
                                       out: torch.Tensor | None = None,
                                       *, target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Quantize with a given SF: ``q = cast(x * (1 / sf))``; returns the data only.

    Same arguments as ``per_token_cast`` except that ``x`` must be a plain tensor, the SF is
    an input, and ``out`` is the data alone.

    Args:
        x: bf16/fp32 ``(M, K)``, ``K`` a multiple of 64, unit stride along ``K`` (not a
            ``(data, sf)`` tuple).
        sf: Row-major ``(M, ceil(K / num_per_channels))`` SF: float32, or ``float8_e4m3fn``
            with ``use_e4m3_sf``; on ``x``'s device.
        use_tma_aligned_col_major_sf: Must be False (a precomputed SF is row-major).
        use_packed_ue8m0: Must be False (a precomputed SF is unpacked).
        use_e4m3_sf: Whether ``sf`` is E4M3 (else float32).
        out: Optional preallocated data, shape and dtype as returned (rows may be padded).

    Returns:
        The data, as ``per_token_cast`` returns them (``out`` when given).

    Raises:
        TypeError: ``sf`` is not a tensor, or its dtype does not match ``use_e4m3_sf``;
            otherwise as ``per_token_cast``.
        ValueError: ``x`` is a ``(data, sf)`` tuple; ``use_packed_ue8m0`` or
            ``use_tma_aligned_col_major_sf`` is True; ``sf`` has the wrong shape, layout or
            device; ``out`` overlaps ``x`` or ``sf``; otherwise as ``per_token_cast``.
    """
    return PER_TOKEN_CAST_WITH_PRECOMPUTED_SF(x, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf, round_sf,
                                              use_packed_ue8m0, use_e4m3_sf, out=None if out is None else (out,),
                                              target=target, flavor=flavor)
