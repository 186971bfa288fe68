"""``swiglu_backward`` and ``swiglu_backward_and_per_token_cast``: public dispatch (validation,
allocation, backend choice).

The backward of ``act = silu(x_l) · x_r`` (with optional clamping, per-row routing weights and
the MoE psum row layout) over ``x = [x_l | x_r]``: the input gradient ``[dA | dB]``, optionally
quantized per token to E4M3 over the full ``2H`` width, the routing-weight gradient and the
recomputed activation. Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are
vmi's additions (see vmi_core.targets).

The torch custom ops return a fixed tuple (absent optional outputs as empty tensors); the public
functions build TileKernels' tuple of the outputs that are present.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_bool, check_float, check_int_choice, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import generator, randn
from vmi_quant.sf_layout import SFLayout

from ..config import get_amax_clamp_for_quant, get_token_alignment
from ..inputs import PLAIN_DTYPES, check_matrix, check_psum, check_same_device, check_sf_options, expert_rows
from ..kernels import swiglu_backward as parallel
from ..kernels.common import ScaleRule
from ..reference import swiglu_backward as reference
from ..reference.cast import cast as reference_cast
from . import demo

PLAIN_FMTS = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class SwigluBackwardCall:
    """A validated call: the kernel specialisation, the (flattened) inputs and the outputs."""

    spec: parallel.SwigluBackwardSpec
    flavor: Flavor
    x: torch.Tensor
    x_sf: torch.Tensor | None
    act_x_grad: torch.Tensor
    psum: torch.Tensor | None
    topk_weights: torch.Tensor | None
    routed_scaling_factor: float | None
    clamp_value: float | None
    alignment: int
    x_grad: torch.Tensor
    x_grad_fp8: torch.Tensor | None
    x_grad_fp8_sf: torch.Tensor | None
    weight_grad: torch.Tensor
    act_out: torch.Tensor


def _rows(t: torch.Tensor, width: int, name: str) -> torch.Tensor:
    """``t`` as ``(N, width)``: a 2-D matrix (any row stride) or a contiguous tensor of more dims."""
    if t.dim() == 2:
        check_matrix(t, name)
    elif t.dim() == 3 and t.is_contiguous():
        t = t.view(-1, t.shape[-1])
    else:
        raise ValueError(f"{name} must be 2-D, or 3-D and contiguous, got shape {tuple(t.shape)} and strides "
                         f"{tuple(t.stride())}")
    if t.shape[1] != width:
        raise ValueError(f"{name} must have {width} columns, got shape {tuple(t.shape)}")
    return check_kernel_extent(t, name)


def make_spec(in_fmt: str, grad_fmt: str, out_fmt: str, hidden: int, flavor: Flavor, *, weights: bool,
              clamp: bool, recompute: bool, psum: bool, num_per_channels: int | None = None,
              round_sf: bool = False, sf_layout: SFLayout | None = None) -> parallel.SwigluBackwardSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now)."""
    rule = None
    if num_per_channels is not None:
        rule = ScaleRule("e4m3", get_amax_clamp_for_quant("e4m3", False), round_sf=round_sf, stored=sf_layout.kind)
    return parallel.SwigluBackwardSpec(in_fmt, grad_fmt, out_fmt, hidden, flavor.name, weights, clamp, recompute,
                                       psum, num_per_channels, rule, sf_layout)


def _prepare(quantized, x, x_sf, act_x_grad, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
             use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute, target, flavor):
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if quantized and fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' (swiglu_backward_and_per_token_cast quantizes the gradient; "
                         f"swiglu_backward gives bf16/fp32), got {fmt!r}")
    if not quantized and fmt not in PLAIN_FMTS:
        raise ValueError(f"fmt must be 'bf16' or 'fp32', got {fmt!r}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor{' or a (data, sf) tuple' if quantized else ''}, "
                        f"got {type(x).__name__}")
    device = x.device
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    check_bool(do_recompute, "do_recompute")
    check_bool(use_tma_aligned_col_major_sf, "use_tma_aligned_col_major_sf")
    check_sf_options(round_sf, use_packed_ue8m0, False)
    if not quantized and (use_tma_aligned_col_major_sf or round_sf or use_packed_ue8m0):
        raise ValueError("the SF options need the quantized gradient (swiglu_backward_and_per_token_cast)")

    if x.dim() not in (2, 3) or x.shape[-1] % 2:
        raise ValueError(f"x must be 2-D or 3-D with an even last dim (gate | up), got shape {tuple(x.shape)}")
    hidden = x.shape[-1] // 2
    if quantized:
        if x.dtype != torch.float8_e4m3fn:
            raise TypeError(f"x data must be float8_e4m3fn, got {x.dtype}")
        npc = check_int_choice(num_per_channels, "num_per_channels", parallel.NUM_PER_CHANNELS)
    elif x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    x = _rows(x, 2 * hidden, "x data" if quantized else "x")
    num_tokens = x.shape[0]
    if hidden % parallel.HIDDEN_ALIGN:
        raise ValueError(f"the hidden size (half the width of x) must be a multiple of {parallel.HIDDEN_ALIGN}, "
                         f"got {hidden}")
    if hidden > parallel.MAX_HIDDEN:
        raise ValueError(f"the hidden size (half the width of x) must be at most {parallel.MAX_HIDDEN} (a row is "
                         f"one on-chip tile), got {hidden}")
    if quantized:
        if hidden % npc:
            raise ValueError(f"the hidden size {hidden} must be a multiple of num_per_channels {npc}")
        check_tensor(x_sf, "x sf", dtype=torch.float32, shape=(num_tokens, 2 * hidden // npc), contiguous=True)
        check_same_device(x_sf, "x sf", device)

    if not isinstance(act_x_grad, torch.Tensor):
        raise TypeError(f"act_x_grad must be a torch.Tensor, got {type(act_x_grad).__name__}")
    check_same_device(act_x_grad, "act_x_grad", device)
    if act_x_grad.dtype not in PLAIN_DTYPES:
        raise TypeError(f"act_x_grad must be bfloat16 or float32, got {act_x_grad.dtype}")
    if not quantized and act_x_grad.dtype != x.dtype:
        raise TypeError(f"act_x_grad must have the dtype of x ({x.dtype}), got {act_x_grad.dtype}")
    act_x_grad = _rows(act_x_grad, hidden, "act_x_grad")
    if act_x_grad.shape[0] != num_tokens:
        raise ValueError(f"act_x_grad must have {num_tokens} rows (those of x), got shape {tuple(act_x_grad.shape)}")

    if topk_weights is not None:
        check_tensor(topk_weights, "topk_weights", dtype=torch.float32, shape=(num_tokens,), contiguous=True)
        check_same_device(topk_weights, "topk_weights", device)
    if routed_scaling_factor is not None:
        if topk_weights is None:
            raise ValueError("routed_scaling_factor requires topk_weights")
        routed_scaling_factor = check_float(routed_scaling_factor, "routed_scaling_factor", finite=True)
    if clamp_value is not None:
        clamp_value = check_float(clamp_value, "clamp_value", finite=True)
        if clamp_value < 0:
            raise ValueError(f"clamp_value must be >= 0, got {clamp_value}")
    alignment = get_token_alignment()
    if psum is not None:
        check_psum(psum, "psum_num_tokens_per_expert", num_tokens, device)

    out_dtype = torch.bfloat16 if quantized else PLAIN_FMTS[fmt]
    x_grad = torch.empty((num_tokens, 2 * hidden), dtype=out_dtype, device=device)
    act_out = torch.empty((num_tokens if do_recompute else 0, hidden), dtype=out_dtype, device=device)
    weight_grad = torch.empty((num_tokens if topk_weights is not None else 0,), dtype=torch.float32, device=device)
    x_grad_fp8 = x_grad_fp8_sf = layout = None
    if quantized:
        layout = SFLayout.of(flavor, packed=use_packed_ue8m0, col_major=use_tma_aligned_col_major_sf)
        x_grad_fp8 = torch.empty((num_tokens, 2 * hidden), dtype=torch.float8_e4m3fn, device=device)
        x_grad_fp8_sf = layout.allocate(num_tokens, 2 * hidden // npc, flavor, device)

    in_fmt = "e4m3" if quantized else PLAIN_DTYPES[x.dtype]
    spec = make_spec(in_fmt, PLAIN_DTYPES[act_x_grad.dtype], "bf16" if quantized else fmt, hidden, flavor,
                     weights=topk_weights is not None, clamp=clamp_value is not None, recompute=do_recompute,
                     psum=psum is not None, num_per_channels=npc if quantized else None, round_sf=round_sf,
                     sf_layout=layout)
    if target in ("ascend", "ascend-sim") and parallel.ascend_ub_bytes(spec) > parallel.ASCEND_UB_BYTES:
        raise ValueError(f"the hidden size {hidden} is too large for the Ascend UB with these options (a work tile "
                         f"holds whole rows: {parallel.ascend_ub_bytes(spec)} bytes, at most "
                         f"{parallel.ASCEND_UB_BYTES})")
    call = SwigluBackwardCall(spec, flavor, x, x_sf if quantized else None, act_x_grad, psum, topk_weights,
                              routed_scaling_factor, clamp_value, alignment, x_grad, x_grad_fp8, x_grad_fp8_sf,
                              weight_grad, act_out)
    return target, call


def _reference(call: SwigluBackwardCall, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) -> None:
    spec = call.spec
    num_tokens = call.x.shape[0]
    if call.psum is None:
        valid = torch.ones(num_tokens, dtype=torch.bool, device=call.x.device)
    else:
        valid = expert_rows(call.psum, num_tokens, call.alignment)
    x = call.x if call.x_sf is None else (call.x, call.x_sf)
    a, b = reference.dequantize_halves(x, spec.num_per_channels)
    d_a, d_b, act_out, weight_grad = reference.swiglu_backward(
        a, b, call.act_x_grad, valid, call.topk_weights, call.routed_scaling_factor, call.clamp_value, call.flavor)
    grad = torch.cat([d_a, d_b], dim=1)
    call.x_grad.copy_(grad)
    if spec.recompute:
        call.act_out.copy_(act_out)
    if weight_grad is not None:
        call.weight_grad.copy_(weight_grad)
    if spec.num_per_channels is not None:
        data, sf = reference.quantize_grad(grad, valid, spec.num_per_channels, round_sf, use_tma_aligned_col_major_sf,
                                           use_packed_ue8m0, call.flavor)
        call.x_grad_fp8.copy_(data)
        call.x_grad_fp8_sf.copy_(sf)


def _execute(quantized, x, x_sf, act_x_grad, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
             use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute, target, flavor,
             launch) -> SwigluBackwardCall:
    target, call = _prepare(quantized, x, x_sf, act_x_grad, fmt, num_per_channels, psum, topk_weights,
                            routed_scaling_factor, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                            clamp_value, do_recompute, target, flavor)
    if launch and target == "torch":
        _reference(call, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    elif launch:
        parallel.launch(call, target)
    return call


def _run_plain(x, act_x_grad, fmt, psum, topk_weights, routed_scaling_factor, clamp_value, do_recompute, *, out,
               target, flavor, launch):
    call = _execute(False, x, None, act_x_grad, fmt, None, psum, topk_weights, routed_scaling_factor, False, False,
                    False, clamp_value, do_recompute, target, flavor, launch)
    return call.x_grad, call.weight_grad, call.act_out


def _run_cast(x, x_sf, act_x_grad, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
              use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute, *, out, target,
              flavor, launch):
    call = _execute(True, x, x_sf, act_x_grad, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
                    use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute, target,
                    flavor, launch)
    return call.x_grad, call.x_grad_fp8, call.x_grad_fp8_sf, call.weight_grad, call.act_out


_OPTIONAL_INPUTS = (Param("psum_num_tokens_per_expert", "Tensor", None, optional=True),
                    Param("topk_weights", "Tensor", None, optional=True),
                    Param("routed_scaling_factor", "float", None, optional=True))
_CLAMP_AND_RECOMPUTE = (Param("clamp_value", "float", None, optional=True), Param("do_recompute", "bool", False))

# The command's shapes are those of x, (tokens, 2 * hidden): MoE expert rows at DeepSeek-V3/V4
# intermediate sizes (H 2048, 3584), and a decode-size call.
_OPTIONS = (
    Option("fmt", "bf16", ("bf16", "fp32"), "dtype of x, act_x_grad and the outputs"),
    Option("weights", True, help="topk_weights and routed_scaling_factor 2.5 (the weight gradient)"),
    Option("psum", True, help="rows in 8 experts of the psum layout (token alignment padding)"),
    Option("clamp", False, help="clamp_value 10"),
    Option("do_recompute", False, help="also return the recomputed activation"),
)
_CAST_OPTIONS = (
    Option("num_per_channels", 32, (32, 128), "channels per scaling factor (input and output)"),
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
    *_OPTIONS[1:],
)
_EXPERTS = 8
_DEFAULT_SHAPE = (4096, 4096)
_BENCH_SHAPES = ((4096, 4096), (2048, 7168), (128, 4096))


def _inputs(shape, options, seed, x_dtype=None):
    tokens, width = shape
    dtype = x_dtype or demo.IN_DTYPES[options["fmt"]]
    inputs = {"x": randn(shape, seed, dtype), "act_x_grad": randn((tokens, width // 2), seed + 1, dtype)}
    if options["weights"]:
        inputs["topk_weights"] = torch.rand(tokens, generator=generator(seed + 2))
    if options["psum"]:
        inputs["psum_num_tokens_per_expert"] = demo.swiglu_psum(tokens, _EXPERTS, seed + 3)
    return inputs


def _cast_inputs(shape, options, seed):
    inputs = _inputs(shape, options, seed, torch.bfloat16)
    inputs["x"], inputs["x_sf"] = reference_cast(inputs["x"], "e4m3", (1, options["num_per_channels"]))
    return inputs


def _arguments(inputs, options, flavor):
    return {"routed_scaling_factor": 2.5 if options["weights"] else None,
            "clamp_value": 10.0 if options["clamp"] else None}


def _cast_arguments(inputs, options, flavor):
    return {"fmt": "e4m3", **_arguments(inputs, options, flavor)}


def _kernels(options, target, flavor, quantized: bool):
    # The kernel is specialised on the hidden size: that of the default shape (the token count
    # does not matter, a few rows give it).
    shape = (128, _DEFAULT_SHAPE[1])
    inputs = demo.on_meta(_cast_inputs(shape, options, 0) if quantized else _inputs(shape, options, 0))
    args = _arguments(inputs, options, flavor)
    sf = ((options["num_per_channels"], options["use_tma_aligned_col_major_sf"], options["round_sf"],
           options["use_packed_ue8m0"]) if quantized else (None, False, False, False))
    _, call = _prepare(quantized, inputs["x"], inputs.get("x_sf"), inputs["act_x_grad"],
                       "e4m3" if quantized else options["fmt"], sf[0], inputs.get("psum_num_tokens_per_expert"),
                       inputs.get("topk_weights"), args["routed_scaling_factor"], *sf[1:], args["clamp_value"],
                       options["do_recompute"], target, flavor)
    return [(parallel.build_swiglu_backward, call.spec)]


SWIGLU_BACKWARD = KernelOp(
    "swiglu_backward",
    (Param("x", "Tensor"), Param("act_x_grad", "Tensor"), Param("fmt", "str"), *_OPTIONAL_INPUTS,
     *_CLAMP_AND_RECOMPUTE),
    ("x_grad", "weight_grad", "act_out"), _run_plain,
    command=Command(
        summary="SwiGLU backward (gradients of gate and up, weight gradient, recomputed activation) in bf16/fp32",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=_BENCH_SHAPES,
        make_inputs=_inputs, kernels=lambda options, target, flavor: _kernels(options, target, flavor, False),
        options=_OPTIONS, arguments=_arguments))
SWIGLU_BACKWARD_AND_PER_TOKEN_CAST = KernelOp(
    "swiglu_backward_and_per_token_cast",
    (Param("x", "Tensor"), Param("x_sf", "Tensor"), Param("act_x_grad", "Tensor"), Param("fmt", "str"),
     Param("num_per_channels", "int"), *_OPTIONAL_INPUTS, Param("use_tma_aligned_col_major_sf", "bool", False),
     Param("round_sf", "bool", False), Param("use_packed_ue8m0", "bool", False), *_CLAMP_AND_RECOMPUTE),
    ("x_grad", "x_grad_fp8", "x_grad_fp8_sf", "weight_grad", "act_out"), _run_cast,
    command=Command(
        summary="SwiGLU backward of an E4M3 input, the gradient also quantized per token to E4M3 (2H wide)",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=_BENCH_SHAPES,
        make_inputs=_cast_inputs, kernels=lambda options, target, flavor: _kernels(options, target, flavor, True),
        options=_CAST_OPTIONS, arguments=_cast_arguments))


def _present(x_grad, quantized, weight_grad, act_out, has_weights: bool, do_recompute: bool) -> tuple:
    result = [x_grad]
    if quantized is not None:
        result.append(quantized)
    if has_weights:
        result.append(weight_grad)
    if do_recompute:
        result.append(act_out)
    return tuple(result)


def swiglu_backward(x: torch.Tensor, act_x_grad: torch.Tensor, fmt: str,
                    psum_num_tokens_per_expert: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                    routed_scaling_factor: float | None = None, clamp_value: float | None = None,
                    do_recompute: bool = False, *, target: str | None = None, flavor: str | None = None) -> tuple:
    """The SwiGLU backward (spec quant-b §7.2) in bf16 or fp32.

    With ``a = x[:, :H]`` (gate), ``b = x[:, H:]`` (up), ``g = act_x_grad``, per element in fp32:
    ``a' = min(a, c)``, ``b' = clamp(b, -c, c)`` (``c = clamp_value``, identity without it),
    ``den = 1 + exp(-a')``, ``s = 1 / den``, ``act = (a' / den) · b'``, ``gws = (g · W) · s`` with
    the row weight ``W = topk_weights · routed_scaling_factor`` (1 without weights),
    ``dA = (gws · b') · (1 + a'(1 - s))`` (0 where ``a > c``), ``dB = gws · a'`` (0 where
    ``|b| > c``), ``act_out = act · W``, ``weight_grad = sum(g · act) · routed_scaling_factor``.
    Every step is one correctly rounded fp32 operation; ``exp`` is correctly rounded. The flavors
    differ in ``1 + a'(1 - s)`` (``cuda``: one fused multiply-add; ``ascend``: product and sum
    rounded separately) and in the divisions (``ascend``: subnormal operands and quotients are
    flushed to zero, as the Ascend vector unit divides; ``cuda``: IEEE). ``weight_grad`` sums in
    vmi's fixed order (``vmi_core.sums.lane_sum_fused``: 64 lane partials of fused products,
    then pairwise folds), so every target gives the same bits.

    Rows outside every expert of ``psum_num_tokens_per_expert`` (padding, with the token
    alignment of ``vmi_quant.config.get_token_alignment``) are written as +0 in every output,
    whatever they hold (TileKernels requires them to be 0 and then gives +0 as well).

    Non-finite values: NaN and ±inf in a valid row propagate through the fp32 steps above (the
    sign and payload of a NaN result are unspecified; with ``clamp_value``, a NaN's clamped value
    and its clamp test are unspecified).

    Args:
        x: bf16/fp32 ``(N, 2H)`` (unit stride along the width, any row stride) or contiguous
            ``(B, N', 2H)``, flattened to ``N = B · N'`` rows; ``H`` a multiple of 64, at most 8192
            (on Ascend targets: as long as a tile of whole rows fits the UB).
        act_x_grad: The gradient of the SwiGLU output: ``(N, H)`` (or contiguous 3-D, flattened)
            of x's dtype.
        fmt: Output dtype of ``x_grad`` and ``act_out``: ``"bf16"`` or ``"fp32"``.
        psum_num_tokens_per_expert: Optional 1-D contiguous int32 prefix sums of the tokens per
            expert (non-decreasing, non-empty): expert ``e`` owns rows
            ``[align(psum[e-1], A), psum[e])``; the other rows are padding.
        topk_weights: Optional fp32 contiguous ``(N,)`` routing weight per row.
        routed_scaling_factor: Optional finite factor of the weights and of ``weight_grad``;
            needs ``topk_weights``.
        clamp_value: Optional ``c >= 0`` (finite): the gate is clamped from above, the up input
            to ``[-c, c]``, and a clamped input gets a zero gradient.
        do_recompute: Also return ``act_out``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions, ``"ascend"`` or ``"cuda"`` (see ``vmi_core.targets``). Only
            choosable on ``cpu`` and ``torch`` (default ``$VMI_FLAVOR``, else ``"ascend"``).

    Returns:
        A tuple: ``x_grad`` ``(N, 2H)`` = ``[dA | dB]`` in ``fmt``; then ``weight_grad`` fp32
        ``(N,)`` when ``topk_weights`` is given; then ``act_out`` ``(N, H)`` in ``fmt`` with
        ``do_recompute``. ``N == 0`` gives empty outputs without a launch.

    Raises:
        TypeError: ``fmt`` is not a str; ``x``, ``act_x_grad``, ``topk_weights`` or
            ``psum_num_tokens_per_expert`` is not a tensor or has the wrong dtype (``act_x_grad``
            must have x's dtype); a number or flag has the wrong type.
        ValueError: ``fmt`` is not ``"bf16"``/``"fp32"``; a tensor has the wrong shape, strides or
            device; ``H`` is not a multiple of 64, above 8192 or (``ascend``, ``ascend-sim``) too
            large for the UB with these options; ``psum_num_tokens_per_expert`` is
            empty or decreasing; ``routed_scaling_factor`` without ``topk_weights``; a factor is
            not finite or ``clamp_value`` negative; ``target``/``flavor`` as for every op.
    """
    x_grad, weight_grad, act_out = SWIGLU_BACKWARD(x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights,
                                                   routed_scaling_factor, clamp_value, do_recompute, target=target,
                                                   flavor=flavor)
    return _present(x_grad, None, weight_grad, act_out, topk_weights is not None, do_recompute)


swiglu_backward_parallel = parallel_entry(swiglu_backward, "x")


def swiglu_backward_and_per_token_cast(x: tuple[torch.Tensor, torch.Tensor], act_x_grad: torch.Tensor, fmt: str,
                                       num_per_channels: int, psum_num_tokens_per_expert: torch.Tensor | None = None,
                                       topk_weights: torch.Tensor | None = None,
                                       routed_scaling_factor: float | None = None,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False, clamp_value: float | None = None,
                                       do_recompute: bool = False, *, target: str | None = None,
                                       flavor: str | None = None) -> tuple:
    """The SwiGLU backward of an E4M3 input, with the gradient also quantized per token to E4M3.

    The math is ``swiglu_backward``'s on the dequantized input ``f32(data) · sf``. The fp32
    gradient ``[dA | dB]`` is returned in bf16 and quantized in groups of ``num_per_channels``
    over the full ``2H`` width (the first ``H / npc`` SF columns cover ``dA``, the next ``dB``),
    with ``per_token_cast``'s scales (amax clamp, ``round_sf``) and layouts. Padding rows (see
    ``swiglu_backward``) get +0 gradients, E4M3 data 0 and SF 0 (fp32 0.0, UE8M0 byte 0).

    Non-finite values: as ``swiglu_backward``; a gradient group holding a NaN or inf is quantized
    as ``per_token_cast`` quantizes it.

    Args:
        x: ``(data, sf)``: ``float8_e4m3fn`` data ``(N, 2H)`` (or contiguous 3-D, flattened; unit
            stride along the width) and its fp32 row-major contiguous SF ``(N, 2H / npc)``.
        act_x_grad: bf16/fp32 ``(N, H)`` gradient of the SwiGLU output (or contiguous 3-D).
        fmt: Must be ``"e4m3"``.
        num_per_channels: Channels per scaling group, of the input SF and of the output: 32 or 128;
            ``H`` must be a multiple of it.
        psum_num_tokens_per_expert: As for ``swiglu_backward``.
        topk_weights: As for ``swiglu_backward``.
        routed_scaling_factor: As for ``swiglu_backward``.
        use_tma_aligned_col_major_sf: Return the SF as a column-major view (as ``per_token_cast``).
        round_sf: Round each scale up to a power of two.
        use_packed_ue8m0: Packed UE8M0 SF in the flavor's words (needs ``round_sf``).
        clamp_value: As for ``swiglu_backward``.
        do_recompute: As for ``swiglu_backward`` (``act_out`` in bf16).
        target: As for ``swiglu_backward``.
        flavor: As for ``swiglu_backward``.

    Returns:
        A tuple: ``x_grad`` bf16 ``(N, 2H)``; ``(x_grad_fp8, x_grad_fp8_sf)`` (E4M3 ``(N, 2H)`` and
        the SF of the ``(N, 2H / npc)`` grid in the requested layout); then ``weight_grad`` with
        ``topk_weights``; then ``act_out`` bf16 ``(N, H)`` with ``do_recompute``.

    Raises:
        TypeError: As ``swiglu_backward``; ``x`` is not a ``(data, sf)`` tuple, its data not
            ``float8_e4m3fn`` or its SF not fp32; ``num_per_channels`` is not an int.
        ValueError: As ``swiglu_backward``; ``fmt`` is not ``"e4m3"``; ``num_per_channels`` is not
            32 or 128 or does not divide ``H``; the SF has the wrong shape or is not contiguous;
            ``use_packed_ue8m0`` without ``round_sf``.
    """
    if not isinstance(x, tuple):
        raise TypeError(f"x must be a quantized (data, sf) tuple, got {type(x).__name__}")
    if len(x) != 2:
        raise ValueError(f"x must be a quantized (data, sf) tuple, got a tuple of {len(x)}")
    x_grad, data, sf, weight_grad, act_out = SWIGLU_BACKWARD_AND_PER_TOKEN_CAST(
        x[0], x[1], act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights,
        routed_scaling_factor, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute,
        target=target, flavor=flavor)
    return _present(x_grad, (data, sf), weight_grad, act_out, topk_weights is not None, do_recompute)


swiglu_backward_and_per_token_cast_parallel = parallel_entry(swiglu_backward_and_per_token_cast, "x")
