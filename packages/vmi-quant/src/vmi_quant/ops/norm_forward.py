"""``norm_forward`` and ``norm_forward_and_per_token_cast``: public dispatch (validation,
allocation, backend choice) of the RMSNorm forward, optionally fused with a residual add and a
per-token E4M3 cast of the normalised output.

Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets). Each public function is one torch custom op
(``torch.ops.vmi.norm_forward``, ``torch.ops.vmi.norm_forward_and_per_token_cast``, with ``.out``
overloads). A custom op cannot return one of its inputs, so the ops return the residual sum (an
empty tensor without a residual) and the Python functions return ``x`` itself as ``norm_input``
when there is no residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vmi_core.checks import check_bool, check_disjoint, check_float, check_int, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.rstd import rstd_constants
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import randn
from vmi_quant.sf_layout import SFLayout, align, ceil_div

from .. import reference
from ..config import get_amax_clamp_for_quant
from ..inputs import PLAIN_DTYPES, check_same_device
from ..kernels import norm_forward as parallel
from ..kernels.common import ScaleRule
from ..reference.norm import mega_moe_window
from . import demo

NUM_PER_CHANNELS = 32
MEGA_SLAB = 128


@dataclass
class NormForwardCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes.

    Tensors are 3-D ``(B, T, H)`` views (a 2-D call has ``B = 1``); ``sf`` is ``(B, T, cols)``,
    ``rstd`` ``(B, T)``. Absent inputs and outputs are None.
    """

    spec: parallel.NormForwardSpec
    flavor: Flavor
    x: torch.Tensor
    weight: torch.Tensor | None
    residual: torch.Tensor | None
    out: torch.Tensor
    rstd: torch.Tensor
    residual_out: torch.Tensor | None
    out_bf16: torch.Tensor | None = None
    sf: torch.Tensor | None = None
    mega_moe_sf: torch.Tensor | None = None


def make_spec(in_fmt: str, hidden: int, eps: float, flavor: Flavor, out_scale: float, has_weight: bool,
              has_residual: bool, quantize: bool = False, round_sf: bool = False, col_major: bool = False,
              packed: bool = False, with_out_bf16: bool = False, mega_moe_block_m: int = 0) -> parallel.NormForwardSpec:
    """The kernel specialisation of validated arguments (the amax clamp is read now)."""
    quant = None
    if quantize:
        layout = SFLayout.of(flavor, packed=packed, col_major=col_major)
        rule = ScaleRule("e4m3", get_amax_clamp_for_quant("e4m3", False), round_sf=round_sf, stored=layout.kind)
        quant = parallel.QuantSpec(rule, layout, with_out_bf16, mega_moe_block_m)
    return parallel.NormForwardSpec(in_fmt, hidden, eps, flavor.name, out_scale, has_weight, has_residual, quant)


def _batched(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.dim() == 3 else t.unsqueeze(0)


def _check_rows(t, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of exactly ``shape`` and ``dtype`` whose last dim is contiguous (other strides free)."""
    check_tensor(t, name, dtype=dtype, shape=shape)
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride along the hidden dim, got strides {tuple(t.stride())}")
    check_same_device(t, name, device)
    return check_kernel_extent(t, name)


def _check_x(x) -> tuple[int, int, int]:
    """``(B, T, H)`` of a valid ``x`` (``B = 1`` for 2-D)."""
    check_tensor(x, "x")
    if x.dtype not in PLAIN_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype}")
    if x.dim() not in (2, 3):
        raise ValueError(f"x must be 2-D (T, H) or 3-D (B, T, H), got shape {tuple(x.shape)}")
    hidden = x.shape[-1]
    if not 1 <= hidden <= parallel.MAX_HIDDEN:
        raise ValueError(f"the hidden size of x must be in [1, {parallel.MAX_HIDDEN}], got {hidden}")
    if hidden > 1 and x.stride(-1) != 1:
        raise ValueError(f"x must have unit stride along the hidden dim, got strides {tuple(x.stride())}")
    check_kernel_extent(x, "x")
    return (1, *x.shape) if x.dim() == 2 else tuple(x.shape)


def _check_common(x, weight, eps, residual, out_scale, target, flavor):
    batch, tokens, hidden = _check_x(x)
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    if weight is not None:
        check_tensor(weight, "weight", dtype=x.dtype, shape=(hidden,), contiguous=True)
        check_same_device(weight, "weight", x.device)
    eps = check_float(eps, "eps")
    # The kernel's rstd constants: also the check of eps. A traced (symbolic) hidden size is within
    # [1, MAX_HIDDEN] by now, where every hidden size takes the same eps.
    rstd_constants(hidden if isinstance(hidden, int) else parallel.MAX_HIDDEN, eps)
    out_scale = check_float(out_scale, "out_scale", finite=True)
    if residual is not None:
        _check_rows(residual, "residual", tuple(x.shape), x.dtype, x.device)
    return target, flavor, (batch, tokens, hidden), eps, out_scale


def _output(t, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return _check_rows(t, name, shape, dtype, device)


def _rstd_output(t, shape: tuple, device: torch.device) -> torch.Tensor:
    if t is None:
        return torch.empty(shape, dtype=torch.float32, device=device)
    check_tensor(t, "rstd", dtype=torch.float32, shape=shape, contiguous=True)
    check_same_device(t, "rstd", device)
    return t


def _residual_output(t, x: torch.Tensor, residual) -> torch.Tensor:
    """The residual sum's buffer; without a residual an empty placeholder (``residual_out`` is ignored)."""
    if residual is None:
        return x.new_empty(0)
    return _output(t, "residual_out", tuple(x.shape), x.dtype, x.device)


def _reference_norm(call: NormForwardCall) -> None:
    spec = call.spec
    x = call.x
    out, rstd, r = reference.norm.norm_forward(x, call.weight, spec.eps, call.residual, spec.out_scale, call.flavor)
    call.out.copy_(out)
    call.rstd.copy_(rstd)
    if call.residual is not None:
        call.residual_out.copy_(r)


def _launch(call: NormForwardCall, target: str, launch: bool, reference_run) -> None:
    if not launch or call.x.numel() == 0:
        return
    if target == "torch":
        reference_run(call)
    else:
        parallel.launch(call, target)


def _run_norm(x, weight, eps, residual, out_scale, *, out, target, flavor, launch):
    target, flavor, (batch, tokens, hidden), eps, out_scale = _check_common(x, weight, eps, residual, out_scale,
                                                                           target, flavor)
    given_out, given_rstd, given_residual_out = out or (None, None, None)
    device = x.device
    out_t = _output(given_out, "out", tuple(x.shape), x.dtype, device)
    rstd = _rstd_output(given_rstd, tuple(x.shape[:-1]), device)
    residual_out = _residual_output(given_residual_out, x, residual)
    check_disjoint({"out": given_out, "rstd": given_rstd,
                    "residual_out": given_residual_out if residual is not None else None},
                   {"x": x, "weight": weight, "residual": residual})
    spec = make_spec(PLAIN_DTYPES[x.dtype], hidden, eps, flavor, out_scale, weight is not None, residual is not None)
    call = NormForwardCall(spec, flavor, _batched(x), weight, _batched(residual), _batched(out_t),
                           rstd.view(batch, tokens), _batched(residual_out) if residual is not None else None)
    _launch(call, target, launch, _reference_norm)
    return out_t, rstd, residual_out


# The RMS epsilon of the command's calls (TileKernels' tests use 1e-6).
NORM_EPS = 1e-6
_OPTIONS = (
    Option("in_dtype", "bf16", tuple(demo.IN_DTYPES), "input dtype"),
    Option("use_weight", True, help="a weight (else unit weight)"),
    Option("use_residual", False, help="a residual added first (returned as residual_out)"),
)
_DEFAULT_SHAPE = (1024, 4096)


def _inputs(shape, options, seed):
    dtype = demo.IN_DTYPES[options["in_dtype"]]
    inputs = {"x": randn(shape, seed, dtype)}
    if options["use_weight"]:
        inputs["weight"] = randn(shape[-1:], seed + 1, dtype)
    if options["use_residual"]:
        inputs["residual"] = randn(shape, seed + 2, dtype)
    return inputs


def _kernels(options, target, flavor, quantize=False):
    # The kernel is specialised on the hidden size: that of the default shape.
    cast = {}
    if quantize:
        cast = dict(round_sf=options["round_sf"], col_major=options["use_tma_aligned_col_major_sf"],
                    packed=options["use_packed_ue8m0"], with_out_bf16=options["with_out_bf16"])
    spec = make_spec(options["in_dtype"], _DEFAULT_SHAPE[1], NORM_EPS, resolve_flavor(target, flavor), 1.0,
                     options["use_weight"], options["use_residual"], quantize, **cast)
    return [(parallel.build_norm_forward, spec)]


NORM_FORWARD = KernelOp(
    "norm_forward",
    (Param("x", "Tensor"), Param("weight", "Tensor", optional=True), Param("eps", "float"),
     Param("residual", "Tensor", None, optional=True), Param("out_scale", "float", 1.0)),
    ("out", "rstd", "residual_out"), _run_norm, outs=("out", "rstd_out", "residual_out"),
    command=Command(
        summary="RMSNorm over the last dim (optional residual add, weight, out_scale) with its rstd",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=demo.BENCH_SHAPES,
        make_inputs=_inputs, kernels=_kernels, options=_OPTIONS,
        arguments=lambda inputs, options, flavor: {"eps": NORM_EPS}))


def _mega_moe_check(mega_moe_sf, mega_moe_block_m, x, round_sf, tokens, hidden):
    """Checks of the Mega MoE SF as the custom op takes it: the ``mega_moe_window`` of the user's
    ``(T, H / 128)`` buffer, ``(R, H / 128)`` with strides ``(1, R)``."""
    check_int(mega_moe_block_m, "mega_moe_block_m")
    if (mega_moe_sf is None) != (mega_moe_block_m == 0):
        raise ValueError("mega_moe_sf and mega_moe_block_m > 0 go together: give both or neither, got "
                         f"mega_moe_sf={'a tensor' if mega_moe_sf is not None else None}, "
                         f"mega_moe_block_m={mega_moe_block_m}")
    if mega_moe_sf is None:
        return
    if mega_moe_block_m < 0:
        raise ValueError(f"mega_moe_block_m must be > 0, got {mega_moe_block_m}")
    if x.dim() != 2:
        raise ValueError(f"mega_moe_sf needs a 2-D x, got shape {tuple(x.shape)}")
    if not round_sf:
        raise ValueError("mega_moe_sf holds UE8M0 exponents: it needs round_sf=True")
    if hidden % MEGA_SLAB:
        raise ValueError(f"mega_moe_sf needs a hidden size that is a multiple of {MEGA_SLAB}, got {hidden}")
    check_tensor(mega_moe_sf, "mega_moe_sf", dtype=torch.int32, shape=(None, hidden // MEGA_SLAB))
    check_same_device(mega_moe_sf, "mega_moe_sf", x.device)
    rows = ceil_div(tokens, mega_moe_block_m) * align(mega_moe_block_m, MEGA_SLAB)
    window_rows = mega_moe_sf.shape[0]
    if window_rows < rows or (mega_moe_sf.numel() > 1 and mega_moe_sf.stride() != (1, window_rows)):
        raise ValueError(f"mega_moe_sf must be M-major with stride(0) == 1 and stride(1) >= {rows} "
                         f"(ceil(T / block_m) * align(block_m, 128)), got {window_rows} rows a column")
    check_kernel_extent(mega_moe_sf, "mega_moe_sf")


def _mega_moe_window(mega_moe_sf, x):
    """The rows of every word column of the user's M-major ``(T, H / 128)`` Mega MoE SF buffer (the
    tensor the custom op takes: tokens map to rows past ``T``)."""
    if not isinstance(mega_moe_sf, torch.Tensor):
        return mega_moe_sf
    check_tensor(mega_moe_sf, "mega_moe_sf", dtype=torch.int32, dim=2)
    if isinstance(x, torch.Tensor) and x.dim() >= 2 and mega_moe_sf.shape[0] != x.shape[-2]:
        raise ValueError(f"mega_moe_sf must have shape (T, H / 128) with T = {x.shape[-2]}, got "
                         f"{tuple(mega_moe_sf.shape)}")
    if mega_moe_sf.stride(0) != 1:
        raise ValueError(f"mega_moe_sf must be M-major with stride(0) == 1, got strides {tuple(mega_moe_sf.stride())}")
    return mega_moe_window(mega_moe_sf)


def _sf_output(given, layout: SFLayout, flavor: Flavor, shape3: tuple, x_dim: int, device) -> torch.Tensor:
    """The SF of §4.3 (allocated, or a given row-major one checked), as ``(B, T, cols)``."""
    batch, tokens, hidden = shape3
    groups = ceil_div(hidden, NUM_PER_CHANNELS)
    cols = layout.logical_shape(tokens, groups)[1]
    lead = () if x_dim == 2 else (batch,)
    if given is not None and layout.col_major:
        # Only the op itself hands in a column-major SF (the one it allocated; the public function
        # refuses a given one): it must be laid out as allocated.
        expected = _sf_output(None, layout, flavor, shape3, x_dim, "meta")
        expected = expected if x_dim == 3 else expected[0]
        check_tensor(given, "out sf", dtype=layout.word_dtype(), shape=tuple(expected.shape))
        if given.stride() != expected.stride():
            raise ValueError(f"out sf must be None with use_tma_aligned_col_major_sf, got strides "
                             f"{tuple(given.stride())}")
        check_same_device(given, "out sf", device)
        return given if x_dim == 3 else given.unsqueeze(0)
    if given is not None:
        check_tensor(given, "out sf", dtype=layout.word_dtype(), shape=(*lead, tokens, cols))
        check_same_device(given, "out sf", device)
        if cols > 1 and given.stride(-1) != 1:
            raise ValueError(f"out sf must be row-major (unit stride along its last dim), got strides "
                             f"{tuple(given.stride())}")
        check_kernel_extent(given, "out sf")
        return given if x_dim == 3 else given.unsqueeze(0)
    if not layout.col_major:
        return layout.allocate(batch * tokens, groups, flavor, device).view(batch, tokens, cols)
    # Col-major: the SF of the batches side by side, each padded to whole packed words.
    side_by_side = layout.allocate(tokens, batch * cols * layout.pack, flavor, device)
    return side_by_side.view(tokens, batch, cols).permute(1, 0, 2)


def _reference_cast(call: NormForwardCall) -> None:
    spec, quant = call.spec, call.spec.quant
    x = call.x if call.mega_moe_sf is None else call.x[0]
    residual = None if call.residual is None else call.residual.view(x.shape)
    q, sf, out_bf16, rstd, r, mega = reference.norm.norm_forward_and_per_token_cast(
        x, call.weight, spec.eps, residual, spec.out_scale, quant.rule.round_sf, quant.sf_layout.col_major,
        quant.sf_layout.kind == "ue8m0", call.mega_moe_sf, quant.mega_block_m, call.flavor)
    call.out.copy_(q.view(call.out.shape))
    call.sf.copy_(sf.reshape(call.sf.shape))
    call.rstd.copy_(rstd.view(call.rstd.shape))
    if call.residual is not None:
        call.residual_out.copy_(r.view(call.residual_out.shape))
    if call.out_bf16 is not None:
        call.out_bf16.copy_(out_bf16.view(call.out_bf16.shape))
    if mega is not None:
        call.mega_moe_sf.copy_(mega)


def _run_cast(x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf,
              use_packed_ue8m0, with_out_bf16, mega_moe_sf, mega_moe_block_m, *, out, target, flavor, launch):
    target, flavor, shape3, eps, out_scale = _check_common(x, weight, eps, residual, out_scale, target, flavor)
    batch, tokens, hidden = shape3
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a str, got {type(fmt).__name__}")
    if fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' (norm_forward_and_per_token_cast quantizes to E4M3), got {fmt!r}")
    if check_int(num_per_channels, "num_per_channels") != NUM_PER_CHANNELS:
        raise ValueError(f"num_per_channels must be {NUM_PER_CHANNELS}, got {num_per_channels}")
    for name, value in (("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf), ("round_sf", round_sf),
                        ("use_packed_ue8m0", use_packed_ue8m0), ("with_out_bf16", with_out_bf16)):
        check_bool(value, name)
    if use_packed_ue8m0 and not round_sf:
        raise ValueError("use_packed_ue8m0 requires round_sf=True (packed UE8M0 holds powers of two)")
    if hidden % NUM_PER_CHANNELS:
        raise ValueError(f"the hidden size of x must be a multiple of {NUM_PER_CHANNELS} to quantize, got {hidden}")
    _mega_moe_check(mega_moe_sf, mega_moe_block_m, x, round_sf, tokens, hidden)
    given_data, given_sf, given_bf16, given_rstd, given_residual_out = out or (None,) * 5
    if not with_out_bf16:
        given_bf16 = None
    device = x.device
    layout = SFLayout.of(flavor, packed=use_packed_ue8m0, col_major=use_tma_aligned_col_major_sf)
    data = _output(given_data, "out data", tuple(x.shape), torch.float8_e4m3fn, device)
    sf = _sf_output(given_sf, layout, flavor, shape3, x.dim(), device)
    out_bf16 = (_output(given_bf16, "out_bf16", tuple(x.shape), torch.bfloat16, device) if with_out_bf16
                else x.new_empty(0, dtype=torch.bfloat16))
    rstd = _rstd_output(given_rstd, tuple(x.shape[:-1]), device)
    residual_out = _residual_output(given_residual_out, x, residual)
    check_disjoint({"out data": given_data, "out sf": given_sf, "out_bf16": given_bf16, "rstd": given_rstd,
                    "residual_out": given_residual_out if residual is not None else None,
                    "mega_moe_sf": mega_moe_sf},
                   {"x": x, "weight": weight, "residual": residual})
    spec = make_spec(PLAIN_DTYPES[x.dtype], hidden, eps, flavor, out_scale, weight is not None, residual is not None,
                     True, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0, with_out_bf16, mega_moe_block_m)
    call = NormForwardCall(spec, flavor, _batched(x), weight, _batched(residual), _batched(data),
                           rstd.view(batch, tokens), _batched(residual_out) if residual is not None else None,
                           _batched(out_bf16) if with_out_bf16 else None, sf, mega_moe_sf)
    _launch(call, target, launch, _reference_cast)
    sf_returned = given_sf if given_sf is not None else sf if x.dim() == 3 else sf[0]
    return data, sf_returned, out_bf16, rstd, residual_out


_CAST_OPTIONS = _OPTIONS + (
    Option("round_sf", False, help="power-of-two scaling factors"),
    Option("use_packed_ue8m0", False, help="packed UE8M0 scaling factors (needs round_sf)"),
    Option("use_tma_aligned_col_major_sf", False, help="column-major scaling factors"),
    Option("with_out_bf16", False, help="also the bf16 normalised output"),
)

NORM_FORWARD_AND_PER_TOKEN_CAST = KernelOp(
    "norm_forward_and_per_token_cast",
    (Param("x", "Tensor"), Param("weight", "Tensor", optional=True), Param("eps", "float"), Param("fmt", "str"),
     Param("num_per_channels", "int"), Param("residual", "Tensor", None, optional=True),
     Param("out_scale", "float", 1.0), Param("use_tma_aligned_col_major_sf", "bool", False),
     Param("round_sf", "bool", False), Param("use_packed_ue8m0", "bool", False),
     Param("with_out_bf16", "bool", False), Param("mega_moe_sf", "Tensor", None, optional=True, mutable=True),
     Param("mega_moe_block_m", "int", 0)),
    ("data", "sf", "out_bf16", "rstd", "residual_out"), _run_cast,
    outs=("out_data", "out_sf", "out_bf16", "out_rstd", "residual_out"),
    command=Command(
        summary="RMSNorm fused with a per-token E4M3 cast of its output (groups of 32, every SF layout)",
        support=demo.PARALLEL_SUPPORT, default_shape=_DEFAULT_SHAPE, bench_shapes=demo.BENCH_SHAPES,
        make_inputs=_inputs, kernels=lambda options, target, flavor: _kernels(options, target, flavor, True),
        options=_CAST_OPTIONS,
        arguments=lambda inputs, options, flavor: {"eps": NORM_EPS, "fmt": "e4m3", "num_per_channels": 32}))


def _norm_input(x: torch.Tensor, residual, residual_out: torch.Tensor) -> torch.Tensor:
    return x if residual is None else residual_out


def norm_forward(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
                 out_scale: float = 1.0, out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
                 *, target: str | None = None,
                 flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim: ``out = r * rstd * (weight * out_scale)`` with
    ``rstd = 1 / sqrt(mean(r^2) + eps)``, ``r = x`` or ``x + residual``.

    Per row, in this order, every step one fp32 operation (spec quant-b §4.2): ``r`` is
    ``x + residual`` rounded to x's dtype; ``S = sum f32(r_i)^2`` in vmi's fixed summation order
    (64 lane partials accumulated by fused multiply-adds, then pairwise folds:
    ``vmi_core.sums``), so every target gives the same bits; ``rstd`` from ``S`` by the flavor's
    formula (``ascend``: the compensated, nearly correctly rounded rstd of §3; ``cuda``:
    ``rsqrt(f32(S / H) + eps)``, see ``vmi_core.rstd``); ``out_i = round(f32(f32(r_i * rstd) * w_i'))``
    with ``w_i' = f32(f32(weight_i) * f32(out_scale))`` (``f32(out_scale)`` without a weight),
    rounded to x's dtype.

    Non-finite values: a NaN or inf in a row's ``r`` makes its ``S`` NaN or inf, so its rstd is NaN
    (``ascend`` flavor; ``cuda``: 0 for an inf sum, NaN for NaN) and its outputs NaN wherever the
    product is undefined; every NaN output is the canonical +NaN (fp32 ``0x7FC00000``, bf16
    ``0x7FC0``). Other rows are not affected. ``residual_out`` is torch's ``x + residual``
    bit for bit, except that a NaN sum is the canonical +NaN too.

    Args:
        x: bf16/fp32 ``(T, H)`` or ``(B, T, H)``, ``1 <= H <= 8192``, unit stride along ``H`` (the
            other strides are free).
        weight: None (unit weight) or ``(H,)`` of x's dtype, contiguous, on x's device.
        eps: Added to the mean square, ``>= 2^-126`` (the compensated rstd needs a normal sum).
        residual: Optional tensor of x's shape and dtype, unit stride along ``H``, added to ``x`` first.
        out_scale: Finite factor the weight is multiplied by (rounded to fp32; a compile-time constant).
        out: Optional output buffer of x's shape and dtype, unit stride along ``H``.
        residual_out: Optional buffer for ``x + residual`` (as ``out``); ignored without ``residual``.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of
            ``x``.
        flavor: Bit conventions, ``"ascend"`` or ``"cuda"`` (see ``vmi_core.targets``). Only
            choosable on ``cpu`` and ``torch``; ``ascend``, ``ascend-sim`` and ``cuda`` use their own.

    Returns:
        out: x's dtype and shape (``out`` when given).
        rstd: float32 ``x.shape[:-1]``.
        norm_input: The normalised input: ``residual_out`` (the sum) with a residual, else ``x``
            itself (the same object; the custom op ``torch.ops.vmi.norm_forward`` returns an empty
            tensor in its place).

    Raises:
        TypeError: A tensor argument is not a tensor or has the wrong dtype (x not bf16/fp32;
            weight, residual, out, residual_out not x's dtype); ``eps`` or ``out_scale`` is not a number.
        ValueError: ``x`` is not 2-D or 3-D, ``H`` is outside ``[1, 8192]``, or a tensor has a
            non-unit stride along ``H``, the wrong shape or device, or is too large for 32-bit
            kernel offsets; ``eps`` is below ``2^-126``; ``out_scale`` is not finite; outputs
            overlap each other or the inputs.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).

    Differences from TileKernels: the square sum has one fixed order on every target (TileKernels'
    orders differ by target and are implementation defined); ``H`` needs no alignment.
    """
    outs = None
    if out is not None or residual_out is not None:
        outs = (out, None, residual_out if residual is not None else None)
    result, rstd, summed = NORM_FORWARD(x, weight, eps, residual, out_scale, out=outs, target=target, flavor=flavor)
    return result, rstd, _norm_input(x, residual, summed)


norm_forward_parallel = parallel_entry(norm_forward, "x")


def norm_forward_and_per_token_cast(
        x: torch.Tensor, weight: torch.Tensor | None, eps: float, fmt: str, num_per_channels: int,
        residual: torch.Tensor | None = None, out_scale: float = 1.0, use_tma_aligned_col_major_sf: bool = False,
        round_sf: bool = False, use_packed_ue8m0: bool = False, with_out_bf16: bool = False,
        out: tuple[torch.Tensor | None, torch.Tensor | None] | None = None, out_bf16: torch.Tensor | None = None,
        residual_out: torch.Tensor | None = None, mega_moe_sf: torch.Tensor | None = None,
        mega_moe_block_m: int = 0, *, target: str | None = None, flavor: str | None = None,
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """``norm_forward`` whose output is quantized per token to E4M3 in groups of 32 channels.

    The normalised output ``u`` (``norm_forward``'s ``out``: rounded to x's dtype, so the result
    equals ``per_token_cast(norm_forward(...))``) is quantized with one scaling factor (SF) per
    token and 32 channels from the group's amax (clamped from below, ``set_amax_clamp_for_quant``):
    ``sf = amax / 448`` and ``q = e4m3(f32(u * (448 / amax)))``, or with ``round_sf`` the power-of-two
    ceiling of ``amax / 448``. NaN/Inf: as ``norm_forward`` for ``rstd``, ``u`` and ``residual_out``;
    the scales and codes of ``u`` as ``per_token_cast`` makes them (vmi-quant README, "Non-finite
    values": a group with a NaN gets a NaN SF, or 0.0 with ``round_sf``, and NaN codes).

    Args:
        x: As for ``norm_forward``, with ``H`` a multiple of 32.
        weight: As for ``norm_forward``.
        eps: As for ``norm_forward``.
        fmt: Must be ``"e4m3"``.
        num_per_channels: Must be 32.
        residual: As for ``norm_forward``.
        out_scale: As for ``norm_forward``.
        use_tma_aligned_col_major_sf: Return the SF column-major (strides ``(1, T')`` per batch, ``T'``
            the token count padded as the flavor pads it: 16 bytes for ``cuda``, none for ``ascend``).
            For 3-D x the SF of all batches is one column-major matrix, batch ``b`` owning SF columns
            ``[b * cols, (b + 1) * cols)``.
        round_sf: Power-of-two scales.
        use_packed_ue8m0: The SF as packed UE8M0 exponent bytes in the flavor's words (int16 of 2 for
            ``ascend``, int32 of 4 for ``cuda``; needs ``round_sf``); unused bytes of the last word of a
            row are not written.
        with_out_bf16: Also return the normalised output as bf16 (``u`` for bf16 x, ``bf16(y)`` for fp32 x).
        out: Optional preallocated ``(data, sf)``: ``float8_e4m3fn`` data of x's shape (unit stride
            along ``H``), and a row-major SF of the returned shape and dtype or None (allocated; must
            be None with ``use_tma_aligned_col_major_sf``).
        out_bf16: Optional bf16 buffer of x's shape (needs ``with_out_bf16``).
        residual_out: As for ``norm_forward``.
        mega_moe_sf: Optional int32 ``(T, H / 128)`` buffer, M-major (``stride(0) == 1``,
            ``stride(1) >= ceil(T / mega_moe_block_m) * align(mega_moe_block_m, 128)``), that also
            receives the scales' exponent bytes (byte ``j`` of word ``(row, w)`` = group ``4w + j``) at
            the rows of DeepGEMM's Mega MoE layout: token ``t``, ``i = t % bm``, goes to row
            ``(t // bm) * align(bm, 128) + (i // 128) * 128 + (i % 32) * 4 + (i % 128) // 32``. Rows no
            token maps to are left untouched. Needs 2-D x, ``round_sf`` and ``H % 128 == 0``.
        mega_moe_block_m: The Mega MoE block ``bm`` (> 0) with ``mega_moe_sf``, else 0.
        target: As for ``norm_forward``.
        flavor: As for ``norm_forward``.

    Returns:
        ``((data, sf), out_bf16, rstd, norm_input)``: E4M3 data of x's shape; the SF (``(T, cols)`` or
        ``(B, T, cols)``, ``cols = H / 32`` or the packed word count, float32 or the flavor's packed
        words); ``out_bf16`` (None without ``with_out_bf16``); float32 ``rstd`` of ``x.shape[:-1]``;
        ``norm_input`` as ``norm_forward`` returns it. Given buffers are returned as themselves.

    Raises:
        TypeError: As ``norm_forward``; ``fmt`` is not a str; ``num_per_channels`` or
            ``mega_moe_block_m`` is not an int; a flag is not a bool; an ``out`` entry,
            ``out_bf16`` or ``mega_moe_sf`` has the wrong dtype.
        ValueError: As ``norm_forward``; ``fmt`` is not ``"e4m3"``; ``num_per_channels`` is not 32;
            ``H`` is not a multiple of 32; ``use_packed_ue8m0`` without ``round_sf``; ``out_bf16``
            without ``with_out_bf16``; a given SF with ``use_tma_aligned_col_major_sf``, or of the
            wrong shape, device or strides; ``mega_moe_sf`` without ``mega_moe_block_m`` or the
            reverse, with a 3-D x, without ``round_sf``, with ``H % 128 != 0``, or of the wrong shape,
            strides or device.
    """
    if out is not None and not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"out must be a (data, sf) tuple or None, got {type(out).__name__}")
    given_data, given_sf = (None, None) if out is None else out
    if given_sf is not None and use_tma_aligned_col_major_sf is True:
        raise ValueError("out sf must be None with use_tma_aligned_col_major_sf (a given SF is row-major)")
    if out_bf16 is not None and with_out_bf16 is not True:
        raise ValueError("out_bf16 is given but with_out_bf16 is False")
    outs = None
    if any(t is not None for t in (given_data, given_sf, out_bf16)) or (residual is not None
                                                                         and residual_out is not None):
        outs = (given_data, given_sf, out_bf16, None, residual_out if residual is not None else None)
    data, sf, bf16, rstd, summed = NORM_FORWARD_AND_PER_TOKEN_CAST(
        x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf,
        use_packed_ue8m0, with_out_bf16, _mega_moe_window(mega_moe_sf, x), mega_moe_block_m, out=outs, target=target,
        flavor=flavor)
    return (data, sf), bf16 if with_out_bf16 else None, rstd, _norm_input(x, residual, summed)


norm_forward_and_per_token_cast_parallel = parallel_entry(norm_forward_and_per_token_cast, "x")
