"""``per_token_cast_and_cast_back``: public dispatch (validation, backend choice).

An in-place quantize-dequantize round trip of every token in groups of
``num_per_channels`` channels, e.g. to simulate quantization noise. Names and
parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_in_place, check_kernel_extent, check_no_internal_overlap, mark_written
from vmi_core.library import KernelOp, Param
from vmi_core.targets import Flavor, resolve_flavor, resolve_target

from . import per_token_cast_and_cast_back_parallel as parallel
from . import reference
from .config import get_amax_clamp_for_quant
from .inputs import PLAIN_DTYPES, check_fmt, check_matrix, check_num_per_channels, check_sf_options
from .kernel_common import ScaleRule


@dataclass
class CastAndCastBackCall:
    """A validated call: the kernel specialisation and the tensor it rewrites."""

    spec: parallel.CastAndCastBackSpec
    x: torch.Tensor
    flavor: Flavor


def make_spec(in_fmt: str, fmt: str, num_per_channels: int, round_sf: bool,
              use_e4m3_sf: bool) -> parallel.CastAndCastBackSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now)."""
    rule = ScaleRule(fmt, get_amax_clamp_for_quant(fmt, use_e4m3_sf), round_sf=round_sf, e4m3_sf=use_e4m3_sf)
    return parallel.CastAndCastBackSpec(in_fmt, fmt, num_per_channels, rule)


def _prepare(x, fmt, num_per_channels, round_sf, use_e4m3_sf, target, flavor) -> tuple[str, CastAndCastBackCall]:
    check_fmt(fmt)
    check_matrix(x, "x")
    if x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    check_no_internal_overlap(x, "x")
    check_kernel_extent(x, "x")
    check_in_place(x, "x", "per_token_cast_and_cast_back")
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    check_sf_options(round_sf, False, use_e4m3_sf)
    check_num_per_channels(num_per_channels)
    hidden = x.shape[1]
    if hidden % 64:
        raise ValueError(f"the hidden size of x must be a multiple of 64, got {hidden}")
    if hidden % num_per_channels:
        raise ValueError(f"the hidden size of x ({hidden}) must be a multiple of num_per_channels "
                         f"({num_per_channels})")
    spec = make_spec(PLAIN_DTYPES[x.dtype], fmt, num_per_channels, round_sf, use_e4m3_sf)
    return target, CastAndCastBackCall(spec, x, flavor)


def _reference(call: CastAndCastBackCall, round_sf: bool, use_e4m3_sf: bool) -> None:
    spec, x = call.spec, call.x
    x.copy_(reference.cast_and_cast_back(x, spec.fmt, spec.num_per_channels, round_sf=round_sf,
                                         use_e4m3_sf=use_e4m3_sf, flavor=call.flavor))


def _run(x, fmt, num_per_channels, round_sf, use_e4m3_sf, *, out, target, flavor, launch) -> None:
    target, call = _prepare(x, fmt, num_per_channels, round_sf, use_e4m3_sf, target, flavor)
    if launch and target == "torch":
        _reference(call, round_sf, use_e4m3_sf)
    elif launch:
        parallel.launch(call, target)
        mark_written(call.x)


PER_TOKEN_CAST_AND_CAST_BACK = KernelOp(
    "per_token_cast_and_cast_back",
    (Param("x", "Tensor", mutable=True), Param("fmt", "str"), Param("num_per_channels", "int"),
     Param("round_sf", "bool", False), Param("use_e4m3_sf", "bool", False)),
    (), _run)


def per_token_cast_and_cast_back(x, fmt: str, num_per_channels: int, round_sf=False, use_e4m3_sf=False,
                                 *, target: str | None = None, flavor: str | None = None) -> None:
    """Quantize every token in groups of ``num_per_channels`` channels and dequantize it back, in place.

    ``x``: bf16/fp32 ``(M, K)``, unit inner stride (the row stride may exceed K), with
    ``K`` a multiple of 64 and of ``num_per_channels`` ∈ {16, 32, 64, 128}. ``fmt``:
    ``"e4m3"`` or ``"e2m1"``. The scale per group is fp32, E4M3 (``use_e4m3_sf``) or a
    power of two (``round_sf``). Returns None.

    Like torch's in-place ops, it bumps ``x``'s version counter (a backward that saved ``x``
    then raises) and, with grad mode on, refuses an ``x`` that requires grad (it has no
    derivative): call it under ``torch.no_grad()``.
    """
    PER_TOKEN_CAST_AND_CAST_BACK(x, fmt, num_per_channels, round_sf, use_e4m3_sf, target=target, flavor=flavor)
