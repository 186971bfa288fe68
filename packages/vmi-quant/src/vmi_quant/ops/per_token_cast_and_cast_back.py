"""``per_token_cast_and_cast_back``: public dispatch (validation, backend choice).

An in-place quantize-dequantize round trip of every token in groups of
``num_per_channels`` channels, e.g. to simulate quantization noise. Names and
parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_in_place, check_kernel_extent, check_no_internal_overlap, mark_written
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import Flavor, resolve_flavor, resolve_target

from .. import reference
from ..config import get_amax_clamp_for_quant
from ..inputs import PLAIN_DTYPES, check_fmt, check_matrix, check_num_per_channels
from ..kernels import per_token_cast_and_cast_back as parallel
from ..kernels.common import ScaleRule
from ..options import SFOptions
from . import demo


@dataclass
class CastAndCastBackCall:
    """A validated call: the kernel specialisation and the tensor it rewrites."""

    spec: parallel.CastAndCastBackSpec
    x: torch.Tensor
    flavor: Flavor
    sf: SFOptions


def make_spec(in_fmt: str, fmt: str, num_per_channels: int, sf: SFOptions) -> parallel.CastAndCastBackSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now).

    ``sf``: the round trip's scale rule (only ``round_sf`` and ``use_e4m3_sf`` apply; nothing is stored).
    """
    rule = ScaleRule(fmt, get_amax_clamp_for_quant(fmt, sf.use_e4m3_sf), round_sf=sf.round_sf,
                     e4m3_sf=sf.use_e4m3_sf)
    return parallel.CastAndCastBackSpec(in_fmt, fmt, num_per_channels, rule)


def _prepare(x, fmt, num_per_channels, sf: SFOptions, target, flavor) -> tuple[str, CastAndCastBackCall]:
    check_fmt(fmt)
    check_matrix(x, "x")
    if x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    check_no_internal_overlap(x, "x")
    check_kernel_extent(x, "x")
    check_in_place(x, "x", "per_token_cast_and_cast_back")
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    check_num_per_channels(num_per_channels)
    hidden = x.shape[1]
    if hidden % 64:
        raise ValueError(f"the hidden size of x must be a multiple of 64, got {hidden}")
    if hidden % num_per_channels:
        raise ValueError(f"the hidden size of x ({hidden}) must be a multiple of num_per_channels "
                         f"({num_per_channels})")
    spec = make_spec(PLAIN_DTYPES[x.dtype], fmt, num_per_channels, sf)
    return target, CastAndCastBackCall(spec, x, flavor, sf)


def _reference(call: CastAndCastBackCall) -> None:
    spec, x = call.spec, call.x
    x.copy_(reference.cast_and_cast_back(x, spec.fmt, spec.num_per_channels, round_sf=call.sf.round_sf,
                                         use_e4m3_sf=call.sf.use_e4m3_sf, flavor=call.flavor))


def _sf_options(round_sf, use_e4m3_sf) -> SFOptions:
    return SFOptions(round_sf=round_sf, use_e4m3_sf=use_e4m3_sf)


def _run(x, fmt, num_per_channels, round_sf, use_e4m3_sf, *, out, target, flavor, launch) -> None:
    target, call = _prepare(x, fmt, num_per_channels, _sf_options(round_sf, use_e4m3_sf), target, flavor)
    if launch and target == "torch":
        _reference(call)
    elif launch:
        parallel.launch(call, target)
        mark_written(call.x)


_OPTIONS = (
    Option("fmt", "e4m3", ("e4m3", "e2m1"), "quantized format of the round trip"),
    Option("num_per_channels", 32, (16, 32, 64, 128), "channels per scaling factor"),
    Option("in_dtype", "bf16", tuple(demo.IN_DTYPES), "input dtype"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_e4m3_sf", False, help="E4M3 scaling factors"),
)


def _kernels(options, target, flavor):
    spec = make_spec(options["in_dtype"], options["fmt"], options["num_per_channels"],
                     _sf_options(options["round_sf"], options["use_e4m3_sf"]))
    return [(parallel.build_per_token_cast_and_cast_back, spec)]


PER_TOKEN_CAST_AND_CAST_BACK = KernelOp(
    "per_token_cast_and_cast_back",
    (Param("x", "Tensor", mutable=True), Param("fmt", "str"), Param("num_per_channels", "int"),
     Param("round_sf", "bool", False), Param("use_e4m3_sf", "bool", False)),
    (), _run,
    command=Command(
        summary="in-place per-token FP8/FP4 quantize-dequantize round trip (quantization noise)",
        support=demo.PARALLEL_SUPPORT, default_shape=(1024, 4096), bench_shapes=demo.BENCH_SHAPES,
        make_inputs=demo.plain_inputs, kernels=_kernels, options=_OPTIONS))


def per_token_cast_and_cast_back(x: torch.Tensor, fmt: str, num_per_channels: int, round_sf: bool = False,
                                 use_e4m3_sf: bool = False,
                                 *, target: str | None = None, flavor: str | None = None) -> None:
    """Quantize every token in groups of ``num_per_channels`` channels and dequantize it back, in place.

    The scale per group is fp32, E4M3 (``use_e4m3_sf``) or a power of two (``round_sf``),
    computed as ``per_token_cast`` computes it; ``x`` is overwritten with
    ``dequantize(quantize(x))`` in its own dtype.

    Like torch's in-place ops, it bumps ``x``'s version counter (a backward that saved ``x``
    then raises) and, with grad mode on, refuses an ``x`` that requires grad (it has no
    derivative): call it under ``torch.no_grad()``.

    Args:
        x: bf16/fp32 ``(M, K)``, unit stride along ``K`` (the row stride may exceed ``K``),
            ``K`` a multiple of 64 and of ``num_per_channels``; rewritten in place, so no two
            of its elements may share memory.
        fmt: Format of the round trip, ``"e4m3"`` or ``"e2m1"`` (FP4).
        num_per_channels: Channels per group: 16, 32, 64 or 128.
        round_sf: Round each scale up to a power of two.
        use_e4m3_sf: Round each scale to E4M3 (exclusive with ``round_sf``).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        None; ``x`` holds the round-tripped values.

    Raises:
        TypeError: ``x`` is not a tensor or not bf16/fp32; ``fmt`` is not a str; a flag is
            not a bool; ``num_per_channels`` is not an int.
        ValueError: ``fmt`` is not ``"e4m3"``/``"e2m1"``; ``num_per_channels`` is not 16, 32,
            64 or 128; ``round_sf`` with ``use_e4m3_sf``; ``x`` is not 2-D, has a non-unit
            stride along ``K``, overlapping rows or elements sharing memory, or is too large
            for 32-bit kernel offsets; ``K`` is not a multiple of 64 and of
            ``num_per_channels``.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        RuntimeError: Grad mode is on and ``x`` requires grad.
    """
    PER_TOKEN_CAST_AND_CAST_BACK(x, fmt, num_per_channels, round_sf, use_e4m3_sf, target=target, flavor=flavor)


per_token_cast_and_cast_back_parallel = parallel_entry(per_token_cast_and_cast_back, "x")
