"""``per_channel_cast``: public dispatch (validation, allocation, backend choice).

Quantizes a bf16/fp32 matrix, or re-quantizes a per-token E4M3 ``(data, sf)`` pair, to E4M3 with
one scaling factor per channel and ``num_per_tokens`` consecutive tokens (blocks ``(npt, 1)``).
Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_int_choice
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import randn
from vmi_quant.sf_layout import SFLayout

from .. import reference
from ..config import get_amax_clamp_for_quant
from ..inputs import CastInput, check_sf_options, decode_input, join_quantized, split_quantized
from ..kernels import per_channel_cast as parallel
from ..kernels.common import ScaleRule
from . import demo


@dataclass
class PerChannelCastCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes."""

    spec: parallel.PerChannelCastSpec
    inp: CastInput
    flavor: Flavor
    out: torch.Tensor
    sf: torch.Tensor


def make_spec(in_fmt: str, num_per_tokens: int, round_sf: bool, sf_layout: SFLayout,
              in_sf_layout: SFLayout | None = None,
              num_per_channels: int | None = None) -> parallel.PerChannelCastSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now)."""
    rule = ScaleRule("e4m3", get_amax_clamp_for_quant("e4m3", False), round_sf=round_sf, stored=sf_layout.kind)
    return parallel.PerChannelCastSpec(in_fmt, num_per_tokens, rule, sf_layout, in_sf_layout, num_per_channels)


def _prepare(x, fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0, target, flavor):
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' (per_channel_cast quantizes to E4M3 only), got {fmt!r}")
    lead = x[0] if isinstance(x, tuple) and x else x
    if not isinstance(lead, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor or a (data, sf) tuple, got {type(x).__name__}")
    device = lead.device
    target = resolve_target(lead, target)
    flavor = resolve_flavor(target, flavor)
    npt = check_int_choice(num_per_tokens, "num_per_tokens", parallel.NUM_PER_TOKENS)
    check_sf_options(round_sf, use_packed_ue8m0, False)
    if isinstance(x, tuple):
        if num_per_channels is None:
            raise ValueError("num_per_channels is required when x is a quantized (data, sf) tuple")
        npc = check_int_choice(num_per_channels, "num_per_channels", parallel.NUM_PER_CHANNELS)
        inp = decode_input(x, (1, npc), flavor)
        if inp.fmt != "e4m3":
            raise TypeError(f"x data must be float8_e4m3fn, got {inp.data.dtype}")
    else:
        if num_per_channels is not None:
            raise ValueError(f"num_per_channels must be None when x is a plain tensor, got {num_per_channels!r}")
        npc = None
        inp = decode_input(x, None, flavor)
    if inp.num_tokens % parallel.ALIGN or inp.hidden % parallel.ALIGN:
        raise ValueError(f"x must have a number of tokens and a hidden size that are multiples of "
                         f"{parallel.ALIGN}, got shape {tuple(inp.data.shape)}")

    layout = SFLayout.of(flavor, packed=use_packed_ue8m0, block_k=1)
    sf = layout.allocate(inp.num_tokens // npt, inp.hidden, flavor, device)
    out = torch.empty((inp.num_tokens, inp.hidden), dtype=torch.float8_e4m3fn, device=device)
    spec = make_spec(inp.fmt, npt, round_sf, layout, inp.sf_layout, npc)
    return target, PerChannelCastCall(spec, inp, flavor, out, sf)


def _reference(call: PerChannelCastCall, x, round_sf, use_packed_ue8m0) -> None:
    spec = call.spec
    x_block = None if spec.num_per_channels is None else (1, spec.num_per_channels)
    data, sf = reference.cast(x, "e4m3", (spec.num_per_tokens, 1), x_block_size=x_block, round_sf=round_sf,
                              use_packed_ue8m0=use_packed_ue8m0, flavor=call.flavor)
    call.out.copy_(data)
    call.sf.copy_(sf)


def _run(x, x_sf, fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0, *, out, target, flavor,
         launch):
    x = join_quantized(x, x_sf)
    target, call = _prepare(x, fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0, target, flavor)
    if launch and target == "torch":
        _reference(call, x, round_sf, use_packed_ue8m0)
    elif launch:
        parallel.launch(call, target)
    return call.out, call.sf


_OPTIONS = (
    Option("num_per_tokens", 32, (32, 128), "tokens per scaling factor"),
    Option("in_dtype", "bf16", ("bf16", "fp32", "e4m3"),
           "input dtype (e4m3: a per-token quantized input with packed UE8M0 column-major SF)"),
    Option("num_per_channels", 128, (32, 128), "channels per input scaling factor (in_dtype=e4m3)"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="UE8M0 scaling factors packed along the tokens (needs round_sf)"),
)
# What a quantized input's SF is: TileKernels' default input configuration.
_INPUT_SF = dict(round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True)


def _inputs(shape, options, seed):
    if options["in_dtype"] != "e4m3":
        return demo.plain_inputs(shape, options, seed)
    # Quantized once per flavor (packed UE8M0 words differ); run and reference pick theirs.
    x = randn(shape, seed)
    return {flavor: reference.cast(x, "e4m3", (1, options["num_per_channels"]), flavor=flavor, **_INPUT_SF)
            for flavor in ("ascend", "cuda")}


def _arguments(inputs, options, flavor):
    if options["in_dtype"] != "e4m3":
        return {"fmt": "e4m3", "num_per_channels": None}
    data, sf = inputs[flavor]
    return {"fmt": "e4m3", "x": data, "x_sf": sf}


def _nbytes(inputs, outputs) -> int:
    tensors = inputs["ascend"] if "ascend" in inputs else (inputs["x"],)
    return sum(t.numel() * t.element_size() for t in (*tensors, *outputs))


def _kernels(options, target, flavor):
    # The specialisation does not depend on the shape: a small input gives it.
    inputs = demo.on_meta(_inputs((128, 128), options, 0))
    quantized = options["in_dtype"] == "e4m3"
    _, call = _prepare(inputs[flavor] if quantized else inputs["x"], "e4m3", options["num_per_tokens"],
                       options["round_sf"], options["num_per_channels"] if quantized else None,
                       options["use_packed_ue8m0"], target, flavor)
    return [(parallel.build_per_channel_cast, call.spec)]


PER_CHANNEL_CAST = KernelOp(
    "per_channel_cast",
    (Param("x", "Tensor"), Param("x_sf", "Tensor", optional=True), Param("fmt", "str"),
     Param("num_per_tokens", "int"), Param("round_sf", "bool", False),
     Param("num_per_channels", "int", None, optional=True), Param("use_packed_ue8m0", "bool", False)),
    ("data", "sf"), _run,
    command=Command(
        summary="per-channel FP8 (E4M3) quantization with one scaling factor per channel and 32 or 128 tokens",
        support=demo.PARALLEL_SUPPORT, default_shape=(1024, 4096), bench_shapes=demo.BLOCK_BENCH_SHAPES,
        make_inputs=_inputs, kernels=_kernels, options=_OPTIONS, arguments=_arguments, nbytes=_nbytes))


def per_channel_cast(x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], fmt: str, num_per_tokens: int,
                     round_sf: bool = False, num_per_channels: int | None = None, use_packed_ue8m0: bool = False, *,
                     target: str | None = None, flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize every channel in blocks of ``num_per_tokens`` consecutive tokens to E4M3.

    Each block of ``num_per_tokens`` tokens of one channel gets one scaling factor (SF) from its
    amax (clamped from below, see ``set_amax_clamp_for_quant``); the data are
    ``e4m3(fl32(v * sf_inv))``. A pre-quantized input (a per-token ``(data, sf)`` pair, as
    ``per_token_cast`` returns it) is dequantized first, ``v = fl32(data * s_in)``, in both flavors
    (the product order ``(data * s_in) * sf_inv``).

    Non-finite values follow ``per_block_cast`` (vmi-quant README, "Non-finite values"): a block
    with a NaN gets a NaN SF (0.0, UE8M0 byte 0, with ``round_sf``) and NaN codes (``±448`` for
    non-zero values with ``round_sf``); a block with ±inf and no NaN gets an SF of +inf (UE8M0
    byte 255), signed zeros and the NaN code at the infinities. A NaN or inf input SF counts as
    such a value.

    Args:
        x: bf16/fp32 ``(T, H)`` with ``T`` and ``H`` multiples of 128 and unit stride along ``H``
            (the row stride may exceed ``H``), or a pre-quantized ``(data, sf)`` tuple:
            ``float8_e4m3fn`` data ``(T, H)`` and its per-token SF over blocks
            ``(1, num_per_channels)``: fp32, ``float8_e4m3fn`` or packed UE8M0 (the flavor's
            words, packed along the channels), row- or column-major, of the shape that SF has for
            ``(T, H)`` (its leading stride is free, so an SF sliced along the tokens is accepted).
        fmt: Output format; must be ``"e4m3"``.
        num_per_tokens: Tokens per scaling block: 32 or 128.
        round_sf: Round each scale up to a power of two.
        num_per_channels: Channels per input-SF block of a pre-quantized ``x``: 32 or 128;
            None for a plain ``x``.
        use_packed_ue8m0: Return the SF as UE8M0 exponent bytes packed along the tokens in the
            flavor's words (needs ``round_sf``).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        data: ``torch.float8_e4m3fn`` ``(T, H)``, contiguous.
        sf: float32 ``(T / num_per_tokens, H)`` row-major, ``sf[b, c]`` the scale of tokens
            ``[b * npt, (b + 1) * npt)`` of channel ``c``; or with ``use_packed_ue8m0`` the
            exponents packed along the tokens, ``(ceil(T / npt / P), H)`` int16 words of ``P = 2``
            (``ascend`` flavor) or int32 words of ``P = 4`` (``cuda`` flavor), byte ``j`` of word
            ``[r, c]`` holding token block ``r * P + j`` (unused bytes zero). ``T == 0`` gives
            empty outputs without a launch.

    Raises:
        TypeError: ``x`` is not a tensor or a ``(data, sf)`` tuple; ``fmt`` is not a str;
            ``num_per_tokens`` or ``num_per_channels`` is not an int; a flag is not a bool; ``x``
            is not bf16/fp32, its data not ``float8_e4m3fn``, or its SF of another dtype.
        ValueError: ``fmt`` is not ``"e4m3"``; ``num_per_tokens`` is not 32 or 128;
            ``num_per_channels`` is missing for a tuple ``x``, given for a plain one, or not 32 or
            128; ``use_packed_ue8m0`` without ``round_sf``; ``x`` (or its data) is not 2-D, has a
            non-unit stride along ``H`` or overlapping rows, is too large for 32-bit kernel
            offsets, or ``T`` or ``H`` is not a multiple of 128; ``x``'s SF has the wrong shape,
            layout or device.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return PER_CHANNEL_CAST(*split_quantized(x), fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0,
                            target=target, flavor=flavor)


per_channel_cast_parallel = parallel_entry(per_channel_cast, "x")
