"""``swiglu_forward`` and ``swiglu_forward_and_per_token_cast``: public dispatch (validation,
allocation, backend choice).

SwiGLU of ``x = [gate | up]`` for MoE expert rows: ``y = silu(min(gate, c)) * clamp(up, -c, c) * w``,
returned as fp32/bf16 or quantized to E4M3 per token in groups of ``num_per_channels``
channels. Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's
additions (see vmi_core.targets).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from vmi_core.checks import check_disjoint, check_float, check_int_choice, check_tensor
from vmi_core.fp32 import division_flushes_subnormals
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.plan import with_values
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import generator, randn
from vmi_quant.sf_layout import SFLayout

from ..config import get_amax_clamp_for_quant, get_token_alignment
from ..inputs import PLAIN_DTYPES, check_matrix, check_psum, check_same_device, check_sf_options, padding_ranges
from ..kernels import swiglu_forward as parallel
from ..kernels.common import ScaleRule
from ..reference import swiglu_forward as reference
from ..reference.cast import to_dtype
from . import demo

_OUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}


@dataclass
class SwigluForwardCall:
    """A validated call: the kernel specialisation plus the tensors and values it reads and writes."""

    spec: parallel.SwigluForwardSpec
    flavor: Flavor
    x: torch.Tensor
    psum: torch.Tensor | None
    topk_weights: torch.Tensor | None
    routed_scaling_factor: float | None
    clamp_value: float | None
    clamped_count: torch.Tensor | None
    alignment: int
    out: torch.Tensor
    sf: torch.Tensor | None = None


def make_spec(in_fmt: str, fmt: str, num_per_channels: int | None = None, sf_layout: SFLayout | None = None,
              round_sf: bool = False, *, with_psum: bool = False, with_weights: bool = False,
              with_scaling_factor: bool = False, with_clamp: bool = False, count_clamped: bool = False,
              flavor: Flavor) -> parallel.SwigluForwardSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now)."""
    rule = None
    if fmt == "e4m3":
        rule = ScaleRule("e4m3", get_amax_clamp_for_quant("e4m3", False), round_sf=round_sf, stored=sf_layout.kind)
    return parallel.SwigluForwardSpec(in_fmt, fmt, num_per_channels, rule, sf_layout, with_psum, with_weights,
                                      with_scaling_factor, with_clamp, count_clamped,
                                      division_flushes_subnormals(flavor))


def _check_x(x) -> tuple[int, int]:
    check_matrix(x, "x")
    if x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    width = x.shape[1]
    if width % (2 * parallel.HIDDEN_ALIGN):
        raise ValueError(f"x must be (N, 2H) [gate | up] with H a multiple of {parallel.HIDDEN_ALIGN}, "
                         f"got width {width}")
    return x.shape[0], width // 2


def _check_expert_inputs(x, psum, topk_weights, routed_scaling_factor, clamp_value, clamped_count):
    num_rows = x.shape[0]
    if psum is not None:
        check_psum(psum, "psum_num_tokens_per_expert", num_rows, x.device)
    if topk_weights is not None:
        check_tensor(topk_weights, "topk_weights", dtype=torch.float32, shape=(num_rows,), contiguous=True)
        check_same_device(topk_weights, "topk_weights", x.device)
    if routed_scaling_factor is not None:
        routed_scaling_factor = check_float(routed_scaling_factor, "routed_scaling_factor", finite=True)
        if topk_weights is None:
            raise ValueError("routed_scaling_factor requires topk_weights")
    if clamp_value is not None:
        clamp_value = check_float(clamp_value, "clamp_value", finite=True)
        if clamp_value < 0:
            raise ValueError(f"clamp_value must be >= 0, got {clamp_value}")
    if clamped_count is not None:
        check_tensor(clamped_count, "clamped_count", dtype=torch.int64, shape=(parallel.NUM_COUNTERS,))
        check_same_device(clamped_count, "clamped_count", x.device)
        if clamp_value is None:
            raise ValueError("clamped_count requires clamp_value")
        check_disjoint({"clamped_count": clamped_count},
                       {"x": x, "psum_num_tokens_per_expert": psum, "topk_weights": topk_weights})
    return routed_scaling_factor, clamp_value


def _prepare(x, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor, use_tma_aligned_col_major_sf,
             round_sf, use_packed_ue8m0, clamp_value, clamped_count, target, flavor) -> tuple[str, SwigluForwardCall]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    num_rows, hidden = _check_x(x)
    layout = None
    if fmt == "e4m3":
        npc = check_int_choice(num_per_channels, "num_per_channels", parallel.NUM_PER_CHANNELS)
        if hidden % npc:
            raise ValueError(f"the hidden size H of x (N, 2H) must be a multiple of num_per_channels={npc}, "
                             f"got {hidden}")
        check_sf_options(round_sf, use_packed_ue8m0, False)
        if not isinstance(use_tma_aligned_col_major_sf, bool):
            raise TypeError("use_tma_aligned_col_major_sf must be a bool")
        layout = SFLayout.of(flavor, packed=use_packed_ue8m0, col_major=use_tma_aligned_col_major_sf)
    routed_scaling_factor, clamp_value = _check_expert_inputs(x, psum, topk_weights, routed_scaling_factor,
                                                              clamp_value, clamped_count)
    out = torch.empty((num_rows, hidden), dtype=_OUT_DTYPES[fmt], device=x.device)
    sf = None if layout is None else layout.allocate(num_rows, hidden // num_per_channels, flavor, x.device)
    spec = make_spec(PLAIN_DTYPES[x.dtype], fmt, num_per_channels if fmt == "e4m3" else None, layout, round_sf,
                     with_psum=psum is not None, with_weights=topk_weights is not None,
                     with_scaling_factor=routed_scaling_factor is not None, with_clamp=clamp_value is not None,
                     count_clamped=clamped_count is not None, flavor=flavor)
    return target, SwigluForwardCall(spec, flavor, x, psum, topk_weights, routed_scaling_factor, clamp_value,
                                     clamped_count, get_token_alignment(), out, sf)


def _reference(call: SwigluForwardCall, use_tma_aligned_col_major_sf: bool, round_sf: bool,
               use_packed_ue8m0: bool) -> None:
    """The reference run: only the valid rows of the outputs are written, as the kernel writes them."""
    spec = call.spec
    args = (call.x, call.psum, call.topk_weights, call.routed_scaling_factor)
    if spec.fmt == "e4m3":
        (data, sf), valid, counts = reference.swiglu_forward_and_per_token_cast(
            call.x, spec.num_per_channels, *args[1:], use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
            round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0, clamp_value=call.clamp_value,
            alignment=call.alignment, flavor=call.flavor)
        call.out[valid] = data[valid]
        call.sf[valid] = sf[valid]
    else:
        y, valid, counts = reference.swiglu_forward(*args, call.clamp_value, call.alignment, call.flavor)
        call.out[valid] = to_dtype(y[valid], call.out.dtype)
    if call.clamped_count is not None:
        call.clamped_count += counts


def _execute(x, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor, use_tma_aligned_col_major_sf,
             round_sf, use_packed_ue8m0, clamp_value, clamped_count, target, flavor, launch) -> SwigluForwardCall:
    target, call = _prepare(x, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
                            use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, clamped_count,
                            target, flavor)
    if launch and x.shape[0] and target == "torch":
        _reference(call, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    elif launch:
        parallel.launch(call, target)
    if launch and psum is not None:
        # The outputs are vmi's: the padding rows the kernel skips are +0 (data) and 0 (SF bytes).
        with_values(psum, functools.partial(_zero_padding_rows, num_rows=x.shape[0], alignment=call.alignment),
                    call.out, call.sf)
    return call


def _zero_padding_rows(ends: list[int], out: torch.Tensor, sf: torch.Tensor | None, num_rows: int,
                       alignment: int) -> None:
    for start, stop in padding_ranges(ends, num_rows, alignment):
        for output in (out, sf):
            if output is not None:
                # No fill kernel for fp8: zero bytes are +0 there too.
                (output.view(torch.uint8) if output.element_size() == 1 else output)[start:stop].zero_()


def _check_fmt(fmt, allowed: tuple[str, ...], op: str) -> None:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt not in allowed:
        raise ValueError(f"fmt must be one of {allowed} for {op}, got {fmt!r}")


def _run_swiglu(x, fmt, psum, topk_weights, routed_scaling_factor, clamp_value, clamped_count, *, out, target,
                flavor, launch):
    _check_fmt(fmt, ("fp32", "bf16"), "swiglu_forward")
    return _execute(x, fmt, None, psum, topk_weights, routed_scaling_factor, False, False, False, clamp_value,
                    clamped_count, target, flavor, launch).out


def _run_swiglu_cast(x, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
                     use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, clamped_count, *, out,
                     target, flavor, launch):
    _check_fmt(fmt, ("e4m3",), "the torch op swiglu_forward_and_per_token_cast (bf16/fp32: swiglu_forward)")
    call = _execute(x, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
                    use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, clamped_count, target,
                    flavor, launch)
    return call.out, call.sf


_EXPERT_PARAMS = (Param("psum_num_tokens_per_expert", "Tensor", None, optional=True),
                  Param("topk_weights", "Tensor", None, optional=True),
                  Param("routed_scaling_factor", "float", None, optional=True))
_CLAMP_PARAMS = (Param("clamp_value", "float", None, optional=True),
                 Param("clamped_count", "Tensor", None, optional=True, mutable=True))

_OPTIONS = (
    Option("in_dtype", "bf16", tuple(demo.IN_DTYPES), "input dtype of x (N, 2H)"),
    Option("experts", 8, help="experts of the psum layout (0: no layout, every row valid)"),
    Option("weights", True, help="per-row topk_weights with routed_scaling_factor 2.5"),
    Option("clamp", True, help="clamp_value 10.0 (the SwiGLU limit)"),
)
_FORWARD_OPTIONS = (Option("fmt", "bf16", ("bf16", "fp32"), "output format"), *_OPTIONS)
_CAST_OPTIONS = (
    Option("num_per_channels", 32, (32, 128), "channels per scaling factor"),
    *_OPTIONS,
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
)
_SCALING_FACTOR = 2.5
_DEFAULT_SHAPE = (1024, 4096)
_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (128, 7168), (1, 7168), (16, 7168))


def _inputs(shape, options, seed):
    num_rows = shape[0]
    inputs = {"x": randn(shape, seed, demo.IN_DTYPES[options["in_dtype"]])}
    if options["experts"]:
        inputs["psum_num_tokens_per_expert"] = demo.swiglu_psum(num_rows, options["experts"], seed)
    if options["weights"]:
        inputs["topk_weights"] = torch.rand(num_rows, generator=generator(seed + 1))
    return inputs


def _arguments(inputs, options, flavor):
    return {"routed_scaling_factor": _SCALING_FACTOR if options["weights"] else None,
            "clamp_value": demo.SWIGLU_CLAMP if options["clamp"] else None}


def _cast_arguments(inputs, options, flavor):
    return {"fmt": "e4m3", **_arguments(inputs, options, flavor)}


def _kernels(options, target, flavor):
    # The specialisation does not depend on the shape: a few rows give it.
    inputs = demo.on_meta(_inputs((128, _DEFAULT_SHAPE[1]), options, 0))
    args = _arguments(inputs, options, flavor)
    fmt = options.get("fmt", "e4m3")
    sf = ((options["use_tma_aligned_col_major_sf"], options["round_sf"], options["use_packed_ue8m0"])
          if fmt == "e4m3" else (False, False, False))
    _, call = _prepare(inputs["x"], fmt, options.get("num_per_channels"), inputs.get("psum_num_tokens_per_expert"),
                       inputs.get("topk_weights"), args["routed_scaling_factor"], *sf, args["clamp_value"], None,
                       target, flavor)
    return [(parallel.build_swiglu_forward, call.spec)]


SWIGLU_FORWARD = KernelOp(
    "swiglu_forward", (Param("x", "Tensor"), Param("fmt", "str"), *_EXPERT_PARAMS, *_CLAMP_PARAMS), ("out",),
    _run_swiglu,
    command=Command(
        summary="SwiGLU of MoE expert rows (x = [gate | up], psum layout, row weights, clamp counters) to bf16/fp32",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=_BENCH_SHAPES,
        make_inputs=_inputs, kernels=_kernels, options=_FORWARD_OPTIONS, arguments=_arguments))
SWIGLU_FORWARD_AND_PER_TOKEN_CAST = KernelOp(
    "swiglu_forward_and_per_token_cast",
    (Param("x", "Tensor"), Param("fmt", "str"), Param("num_per_channels", "int"), *_EXPERT_PARAMS,
     Param("use_tma_aligned_col_major_sf", "bool", False), Param("round_sf", "bool", False),
     Param("use_packed_ue8m0", "bool", False), *_CLAMP_PARAMS),
    ("data", "sf"), _run_swiglu_cast,
    command=Command(
        summary="SwiGLU of MoE expert rows quantized to E4M3 per token (groups of 32 or 128 channels)",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=_BENCH_SHAPES,
        make_inputs=_inputs, kernels=_kernels, options=_CAST_OPTIONS, arguments=_cast_arguments))

def swiglu_forward(x: torch.Tensor, fmt: str, psum_num_tokens_per_expert: torch.Tensor | None = None,
                   topk_weights: torch.Tensor | None = None, routed_scaling_factor: float | None = None,
                   clamp_value: float | None = None, clamped_count: torch.Tensor | None = None,
                   *, target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """SwiGLU of MoE expert rows: ``y = fl(fl(silu(a) * b) * weight)`` in fp32.

    Per element of a valid row, with ``a = min(gate, c)`` and ``b = clamp(up, -c, c)`` (no clamp
    without ``clamp_value``), each step one fp32 operation: ``silu(a) = a / (1 + exp(-a))``
    with a correctly rounded ``exp`` and the flavor's division, then the product with ``b``,
    then with the row weight (when given). ``bf16`` output rounds ``y`` to nearest even.

    Non-finite values follow IEEE arithmetic of these steps (a NaN input stays NaN, ``-inf``
    gate gives ``-inf / inf = NaN``, clamping does not remove a NaN); every NaN written is the
    canonical ``+NaN``. NaN inputs count as neither above nor below the clamp.

    Args:
        fmt: Output format, ``"fp32"`` or ``"bf16"``.
        x: bf16/fp32 ``(N, 2H)`` ``[gate | up]`` with ``H`` a multiple of 64 and unit stride
            along the columns (the row stride may exceed ``2H``).
        psum_num_tokens_per_expert: Optional int32 ``(E,)`` contiguous, non-empty expert layout
            (TileKernels' psum): with ``A = get_token_alignment()``, expert ``e`` owns rows
            ``[align(psum[e-1], A), psum[e])`` (from row 0 for ``e = 0``), ``psum[-1] <= N``. Rows outside every
            expert are padding: they are not read and not counted, and their output rows are
            zeros. None: every
            row is valid.
        topk_weights: Optional fp32 ``(N,)`` contiguous per-row weight ``w``.
        routed_scaling_factor: Optional factor ``r``; the row weight is ``fl(w * fl32(r))``. Needs
            ``topk_weights``.
        clamp_value: Optional ``c >= 0``: the gate is clamped to ``min(gate, c)``, the up
            projection to ``[-c, c]``.
        clamped_count: Optional int64 ``(4,)`` on x's device; needs ``clamp_value``. Over the
            valid rows, on the unclamped inputs, it is incremented (never reset) by the number of
            gate values above ``c``, of up values above ``c``, of up values below ``-c``, and of
            valid output elements (``H`` per valid row).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions, ``"ascend"`` or ``"cuda"`` (see ``vmi_core.targets``): the
            ``ascend`` division flushes subnormal operands and quotients of ``gate / (1 + exp(-gate))``
            to signed zero as the Ascend vector unit does, ``cuda``'s is IEEE. Only choosable on
            ``cpu`` and ``torch`` (default ``$VMI_FLAVOR``, else ``"ascend"``); ``ascend``,
            ``ascend-sim`` and ``cuda`` always use their own.

    Returns:
        ``(N, H)`` fp32 or bf16, contiguous. Rows outside the expert layout are +0. ``N == 0``
        launches nothing and counts nothing.

    Raises:
        ValueError: ``fmt`` is not ``"fp32"`` or ``"bf16"``.
        TypeError: ``x`` is not a tensor or not bf16/fp32; ``fmt`` is not a str;
            ``topk_weights`` is not fp32; ``clamped_count`` is not int64; ``psum_num_tokens_per_expert``
            is not int32; a value has the wrong type.
        ValueError: ``x`` is not 2-D, has a non-unit column stride or overlapping rows, or ``H``
            is not a multiple of 64; ``psum_num_tokens_per_expert`` is not 1-D contiguous, is
            empty, decreases or ends past ``N``; ``topk_weights`` is not ``(N,)`` contiguous;
            ``routed_scaling_factor`` without ``topk_weights``; ``clamp_value`` negative or not
            finite; ``clamped_count`` not ``(4,)``, without ``clamp_value`` or sharing memory with
            an input; a tensor on another device than x.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    return SWIGLU_FORWARD(x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
                          clamped_count, target=target, flavor=flavor)


swiglu_forward_parallel = parallel_entry(swiglu_forward, "x")




def swiglu_forward_and_per_token_cast(x: torch.Tensor, fmt: str, num_per_channels: int | None,
                                      psum_num_tokens_per_expert: torch.Tensor | None = None,
                                      topk_weights: torch.Tensor | None = None,
                                      routed_scaling_factor: float | None = None,
                                      use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                      use_packed_ue8m0: bool = False, clamp_value: float | None = None,
                                      clamped_count: torch.Tensor | None = None, *, target: str | None = None,
                                      flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """SwiGLU of MoE expert rows, quantized to E4M3 per token.

    ``y`` as ``swiglu_forward`` computes it (fp32, after the row weight), then per group of
    ``num_per_channels`` channels of a token: the amax of ``|y|`` (clamped from below, see
    ``set_amax_clamp_for_quant``), the scaling factor (``sf = c / 448`` and ``sf_inv = 448 / c``,
    or powers of two with ``round_sf``) and the codes ``e4m3(fl(y * sf_inv))``, exactly as
    ``per_token_cast`` quantizes an fp32 input (also its non-finite rules: a group with a NaN gets
    a NaN SF, 0 with ``round_sf``). With ``fmt`` ``"fp32"``/``"bf16"`` and ``num_per_channels``
    None this is ``swiglu_forward`` (one tensor returned), as in TileKernels.

    Args:
        fmt: ``"e4m3"``, or ``"fp32"``/``"bf16"`` (then ``num_per_channels`` must be None and the
            SF flags False).
        num_per_channels: Channels per scaling factor, 32 or 128 (a divisor of ``H``).
        use_tma_aligned_col_major_sf: Return the SF as a column-major view (strides ``(1, N')``,
            ``N'`` as the flavor pads it: ``N`` rounded up to 16 bytes for ``cuda``, unpadded for
            ``ascend``).
        round_sf: Round each scale up to a power of two.
        use_packed_ue8m0: Return the SF as packed UE8M0 exponent bytes in the flavor's words
            (int16 of 2 for ``ascend``, int32 of 4 for ``cuda``), packed along the channels (needs
            ``round_sf``).
        x: bf16/fp32 ``(N, 2H)`` ``[gate | up]`` with ``H`` a multiple of 64 and unit stride
            along the columns (the row stride may exceed ``2H``).
        psum_num_tokens_per_expert: Optional int32 ``(E,)`` contiguous, non-empty expert layout
            (TileKernels' psum): with ``A = get_token_alignment()``, expert ``e`` owns rows
            ``[align(psum[e-1], A), psum[e])`` (from row 0 for ``e = 0``), ``psum[-1] <= N``. Rows outside every
            expert are padding: they are not read and not counted, and their output rows are
            zeros. None: every
            row is valid.
        topk_weights: Optional fp32 ``(N,)`` contiguous per-row weight ``w``.
        routed_scaling_factor: Optional factor ``r``; the row weight is ``fl(w * fl32(r))``. Needs
            ``topk_weights``.
        clamp_value: Optional ``c >= 0``: the gate is clamped to ``min(gate, c)``, the up
            projection to ``[-c, c]``.
        clamped_count: Optional int64 ``(4,)`` on x's device; needs ``clamp_value``. Over the
            valid rows, on the unclamped inputs, it is incremented (never reset) by the number of
            gate values above ``c``, of up values above ``c``, of up values below ``-c``, and of
            valid output elements (``H`` per valid row).
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions, ``"ascend"`` or ``"cuda"`` (see ``vmi_core.targets``): the
            ``ascend`` division flushes subnormal operands and quotients of ``gate / (1 + exp(-gate))``
            to signed zero as the Ascend vector unit does, ``cuda``'s is IEEE. Only choosable on
            ``cpu`` and ``torch`` (default ``$VMI_FLAVOR``, else ``"ascend"``); ``ascend``,
            ``ascend-sim`` and ``cuda`` always use their own.

    Returns:
        data: ``torch.float8_e4m3fn`` ``(N, H)``.
        sf: The ``(N, H / num_per_channels)`` scales: float32, or packed UE8M0 words
            ``(N, ceil(H / num_per_channels / P))``; row-major or a column-major view. Rows outside
            the expert layout are zeros in both (pad bytes of packed words are zero).

    Raises:
        ValueError: ``fmt`` is not ``"e4m3"``, ``"fp32"`` or ``"bf16"``; ``num_per_channels`` is
            not 32 or 128, does not divide ``H``, or is given with ``fp32``/``bf16``;
            ``use_packed_ue8m0`` without ``round_sf``; an SF flag with ``fp32``/``bf16``.
        TypeError: ``num_per_channels`` is not an int; an SF flag is not a bool.
        TypeError: ``x`` is not a tensor or not bf16/fp32; ``fmt`` is not a str;
            ``topk_weights`` is not fp32; ``clamped_count`` is not int64; ``psum_num_tokens_per_expert``
            is not int32; a value has the wrong type.
        ValueError: ``x`` is not 2-D, has a non-unit column stride or overlapping rows, or ``H``
            is not a multiple of 64; ``psum_num_tokens_per_expert`` is not 1-D contiguous, is
            empty, decreases or ends past ``N``; ``topk_weights`` is not ``(N,)`` contiguous;
            ``routed_scaling_factor`` without ``topk_weights``; ``clamp_value`` negative or not
            finite; ``clamped_count`` not ``(4,)``, without ``clamp_value`` or sharing memory with
            an input; a tensor on another device than x.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    if isinstance(fmt, str) and fmt in ("fp32", "bf16"):
        if num_per_channels is not None:
            raise ValueError(f"num_per_channels must be None for fmt {fmt!r}, got {num_per_channels!r}")
        for name, flag in (("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf), ("round_sf", round_sf),
                           ("use_packed_ue8m0", use_packed_ue8m0)):
            if flag is not False:
                raise ValueError(f"{name} applies to fmt 'e4m3' only, got {flag!r} with fmt {fmt!r}")
        return swiglu_forward(x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
                              clamped_count, target=target, flavor=flavor)
    return SWIGLU_FORWARD_AND_PER_TOKEN_CAST(x, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights,
                                             routed_scaling_factor, use_tma_aligned_col_major_sf, round_sf,
                                             use_packed_ue8m0, clamp_value, clamped_count, target=target,
                                             flavor=flavor)


swiglu_forward_and_per_token_cast_parallel = parallel_entry(swiglu_forward_and_per_token_cast, "x")
