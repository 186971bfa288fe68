"""``swiglu_forward_and_per_channel_cast_and_transpose``: public dispatch (validation, allocation,
backend choice).

SwiGLU of ``x = [gate | up]`` rounded to bf16, quantized to E4M3 with one scaling factor per
channel and ``num_per_tokens`` tokens, returned transposed (the layout of the weight-gradient GEMM's
operand). TileKernels v1's op (v2 has none); ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_bool, check_float, check_int_choice
from vmi_core.fp32 import division_flushes_subnormals
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import randn

from ..config import get_amax_clamp_for_quant
from ..inputs import check_matrix, check_sf_options
from ..kernels import swiglu_forward_and_per_channel_cast_and_transpose as parallel
from ..kernels.common import ScaleRule
from ..reference import swiglu_forward as reference
from . import demo


@dataclass
class SwigluPerChannelCall:
    """A validated call: the kernel specialisation plus the tensors and values it reads and writes."""

    spec: parallel.SwigluPerChannelSpec
    flavor: Flavor
    x: torch.Tensor
    clamp_value: float | None
    out: torch.Tensor
    sf: torch.Tensor


def make_spec(num_per_tokens: int, round_sf: bool, transpose: bool, with_clamp: bool,
              flavor: Flavor) -> parallel.SwigluPerChannelSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now)."""
    rule = ScaleRule("e4m3", get_amax_clamp_for_quant("e4m3", False), round_sf=round_sf)
    return parallel.SwigluPerChannelSpec(num_per_tokens, rule, transpose, with_clamp,
                                         division_flushes_subnormals(flavor))


def _prepare(x, fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value, target, flavor):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3', got {fmt!r}")
    npt = check_int_choice(num_per_tokens, "num_per_tokens", parallel.NUM_PER_TOKENS)
    check_sf_options(round_sf, False, False)
    check_bool(without_transpose, "without_transpose")
    check_matrix(x, "x")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x must be bfloat16, got {x.dtype}")
    num_tokens, width = x.shape
    if num_tokens % parallel.TOKEN_ALIGN or width % (2 * parallel.HIDDEN_ALIGN):
        raise ValueError(f"x must be (T, 2H) with T a multiple of {parallel.TOKEN_ALIGN} and 2H a multiple of "
                         f"{2 * parallel.HIDDEN_ALIGN}, got shape {tuple(x.shape)}")
    if swiglu_clamp_value is not None:
        swiglu_clamp_value = check_float(swiglu_clamp_value, "swiglu_clamp_value", finite=True)
        if swiglu_clamp_value < 0:
            raise ValueError(f"swiglu_clamp_value must be >= 0, got {swiglu_clamp_value}")
    hidden = width // 2
    shape = (num_tokens, hidden) if without_transpose else (hidden, num_tokens)
    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=x.device)
    sf = torch.empty((num_tokens // npt, hidden), dtype=torch.float32, device=x.device)
    spec = make_spec(npt, round_sf, not without_transpose, swiglu_clamp_value is not None, flavor)
    return target, SwigluPerChannelCall(spec, flavor, x, swiglu_clamp_value, out, sf)


def _run(x, fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value, *, out, target, flavor, launch):
    target, call = _prepare(x, fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value, target, flavor)
    if launch and target == "torch":
        data, sf = reference.swiglu_forward_and_per_channel_cast_and_transpose(
            x, call.spec.num_per_tokens, round_sf, without_transpose, call.clamp_value, call.flavor)
        call.out.copy_(data)
        call.sf.copy_(sf)
    elif launch:
        parallel.launch(call, target)
    return call.out, call.sf


_OPTIONS = (
    Option("num_per_tokens", 32, (32, 128), "tokens per scaling factor"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("without_transpose", False, help="data (T, H) instead of (H, T)"),
    Option("clamp", True, help="swiglu_clamp_value 10.0"),
)


def _kernels(options, target, flavor):
    spec = make_spec(options["num_per_tokens"], options["round_sf"], not options["without_transpose"],
                     options["clamp"], resolve_flavor(target, flavor))
    return [(parallel.build_swiglu_per_channel, spec)]


SWIGLU_FORWARD_AND_PER_CHANNEL_CAST_AND_TRANSPOSE = KernelOp(
    "swiglu_forward_and_per_channel_cast_and_transpose",
    (Param("x", "Tensor"), Param("fmt", "str"), Param("num_per_tokens", "int"), Param("round_sf", "bool", False),
     Param("without_transpose", "bool", False), Param("swiglu_clamp_value", "float", None, optional=True)),
    ("data", "sf"), _run,
    command=Command(
        summary="SwiGLU rounded to bf16, per-channel E4M3 over 32 or 128 tokens, transposed (TileKernels v1)",
        support=demo.PARALLEL_SUPPORT, default_shape=(1024, 4096), bench_shapes=demo.BLOCK_BENCH_SHAPES,
        make_inputs=lambda shape, options, seed: {"x": randn(shape, seed, torch.bfloat16)},
        kernels=_kernels, options=_OPTIONS,
        arguments=lambda inputs, options, flavor: {
            "fmt": "e4m3", "swiglu_clamp_value": demo.SWIGLU_CLAMP if options["clamp"] else None}))


def swiglu_forward_and_per_channel_cast_and_transpose(
        x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False, without_transpose: bool = False,
        swiglu_clamp_value: float | None = None, *, target: str | None = None,
        flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU rounded to bf16, quantized to E4M3 per channel and block of tokens, transposed.

    ``act = bf16(fl32(silu(a) * b))`` with ``a = min(gate, c)``, ``b = clamp(up, -c, c)`` and
    ``silu`` as in ``swiglu_forward`` (correctly rounded exp, the flavor's division); the bf16
    activation is rounded **before** the amax. Then per channel and block of ``num_per_tokens``
    tokens, as ``per_channel_cast`` quantizes a bf16 input: the amax (clamped from below, see
    ``set_amax_clamp_for_quant``), ``sf = c / 448`` and ``sf_inv = 448 / c`` (powers of two with
    ``round_sf``), codes ``e4m3(fl32(act * sf_inv))``. No weights, expert layout or counters (every
    row is computed). Non-finite values: a NaN activation is the canonical NaN; its block gets a
    NaN SF (0 with ``round_sf``) and NaN codes, as ``per_channel_cast`` rules.

    Args:
        x: bf16 ``(T, 2H)`` ``[gate | up]``, ``T`` a multiple of 128, ``H`` of 64, unit stride along
            the columns (the row stride may exceed ``2H``).
        fmt: Must be ``"e4m3"``.
        num_per_tokens: Tokens per scaling block: 32 or 128.
        round_sf: Round each scale up to a power of two.
        without_transpose: Return the data as ``(T, H)`` instead of ``(H, T)``.
        swiglu_clamp_value: Optional ``c >= 0`` (finite) clamping gate and up as in ``swiglu_forward``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions, ``"ascend"`` or ``"cuda"`` (the division of ``swiglu_forward``).
            Only choosable on ``cpu`` and ``torch``.

    Returns:
        data: ``torch.float8_e4m3fn`` ``(H, T)``, or ``(T, H)`` with ``without_transpose``.
        sf: float32 ``(T / num_per_tokens, H)`` row-major, ``sf[b, c]`` the scale of tokens
            ``[b * npt, (b + 1) * npt)`` of channel ``c``. ``T == 0`` gives empty outputs.

    Raises:
        TypeError: ``x`` is not a bf16 tensor; ``fmt`` is not a str; ``num_per_tokens`` is not an
            int; a flag is not a bool; ``swiglu_clamp_value`` is not a float.
        ValueError: ``fmt`` is not ``"e4m3"``; ``num_per_tokens`` is not 32 or 128; ``x`` is not
            2-D, has a non-unit column stride or overlapping rows, or ``T`` / ``2H`` is not a
            multiple of 128; ``swiglu_clamp_value`` is negative or not finite; ``target`` or
            ``flavor`` is unknown or does not match x's device.
    """
    return SWIGLU_FORWARD_AND_PER_CHANNEL_CAST_AND_TRANSPOSE(x, fmt, num_per_tokens, round_sf, without_transpose,
                                                             swiglu_clamp_value, target=target, flavor=flavor)


swiglu_forward_and_per_channel_cast_and_transpose_parallel = parallel_entry(
    swiglu_forward_and_per_channel_cast_and_transpose, "x")
