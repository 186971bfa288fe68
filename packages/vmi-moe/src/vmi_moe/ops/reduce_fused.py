"""``reduce_fused``: public dispatch (validation, allocation, backend choice).

Sums the expanded expert outputs back per token, each used row weighted, in slot order with fused
multiply-adds (``docs/moe/reduce_fused.md``). Names and parameters follow TileKernels v2;
``target`` and ``flavor`` are vmi's additions (see vmi_core.targets).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from vmi_core.checks import check_disjoint, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry
from vmi_core.plan import with_values
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MAX_TOPK, new_status
from ..kernels import reduce_fused as parallel
from ..kernels.common import STATUS_BAD_INDEX
from ..reference import reduce as reference
from .demo import SIMT_SUPPORT

OP = "reduce_fused"
FP8_FORMATS = ("", "e4m3")
_FORMAT_OF = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}
_DTYPE_OF = {fmt: dtype for dtype, fmt in _FORMAT_OF.items()}


@dataclass
class ReduceFusedCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes (absent
    options as the neutral tensors the kernel takes: weights 1, a one-element ``x_sf`` of 1, ``sf`` 1)."""

    spec: parallel.ReduceFusedSpec
    x: torch.Tensor
    x_sf: torch.Tensor
    weights: torch.Tensor
    positions: torch.Tensor
    sf: torch.Tensor
    out: torch.Tensor
    status: torch.Tensor
    num_rows: int


def _prepare(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf, out, target, flavor):
    if not isinstance(fp8_format, str):
        raise TypeError(f"fp8_format must be a str, got {type(fp8_format).__name__}")
    if fp8_format not in FP8_FORMATS:
        raise ValueError(f"fp8_format must be one of {FP8_FORMATS}, got {fp8_format!r}")
    check_tensor(x, "x", dtype=tuple(_FORMAT_OF) if x_sf is not None else (torch.float32, torch.bfloat16))
    target = resolve_target(x, target)
    resolve_flavor(target, flavor)
    device = x.device
    check_tensor(x, "x", dim=2, contiguous=True)
    check_kernel_extent(x, "x")
    num_rows, hidden = x.shape
    check_tensor(token_topk_to_pos, "token_topk_to_pos", dtype=torch.int32, shape=(None, None), device=device,
                 contiguous=True)
    num_tokens, num_topk = token_topk_to_pos.shape
    if not 1 <= num_topk <= MAX_TOPK:
        raise ValueError(f"token_topk_to_pos must have 1 to {MAX_TOPK} columns (num_topk), got {num_topk}")
    if x_sf is not None:
        check_tensor(x_sf, "x_sf", dtype=torch.float32, shape=(num_rows,), device=device, contiguous=True)
    if topk_weights is not None:
        check_tensor(topk_weights, "topk_weights", dtype=torch.float32, shape=(num_tokens, num_topk), device=device,
                     contiguous=True)
    if sf is not None:
        if fp8_format != "e4m3":
            raise ValueError("sf is accepted only with fp8_format='e4m3' (an FP8 output's scale)")
        check_tensor(sf, "sf", dtype=torch.float32, shape=(1,), device=device)
    out_dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else x.dtype
    inputs = {"x": x, "x_sf": x_sf, "topk_weights": topk_weights, "token_topk_to_pos": token_topk_to_pos, "sf": sf}
    if out is not None:
        check_tensor(out, "out", dtype=out_dtype, shape=(num_tokens, hidden), device=device, contiguous=True)
        check_disjoint({"out": out}, inputs)
    else:
        out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=device)
    spec = parallel.ReduceFusedSpec(num_topk, _FORMAT_OF[x.dtype], _FORMAT_OF[out_dtype])
    # The kernel reads every argument: the neutral values stand in for the absent ones, and a
    # one-row x for an empty one (no position can then be used: every one outside [-1, 0) is bad).
    if num_rows == 0:
        x = torch.zeros((1, hidden), dtype=x.dtype, device=device)
    call = ReduceFusedCall(
        spec, x,
        x_sf if x_sf is not None and num_rows else torch.ones(1, dtype=torch.float32, device=device),
        topk_weights if topk_weights is not None else torch.ones((num_tokens, num_topk), device=device),
        token_topk_to_pos,
        sf if sf is not None else torch.ones(1, dtype=torch.float32, device=device),
        out, new_status(device), num_rows)
    return target, call


def _raise_bad_positions(words: list[int], num_rows: int) -> None:
    if words[STATUS_BAD_INDEX]:
        raise ValueError(f"{OP}: token_topk_to_pos holds positions outside [-1, {num_rows}) (x has {num_rows} rows; "
                         f"-1 marks an unused slot)")


def _run(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf, *, out, target, flavor, launch):
    given = out[0] if out else None
    target, call = _prepare(x, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf, given, target, flavor)
    if launch and target == "torch":
        with_values(token_topk_to_pos, functools.partial(_check_positions, num_rows=call.num_rows))
        pair = x if x_sf is None else (x, x_sf)
        call.out.copy_(reference.reduce_fused(pair, topk_weights, token_topk_to_pos, fp8_format, sf))
    elif launch and call.out.numel():
        # A caller's out gets the result only once the kernel's flag is clear.
        staged = replace(call, out=torch.empty_like(call.out)) if given is not None else call
        parallel.launch(staged, target)
        with_values(staged.status, functools.partial(_raise_bad_positions, num_rows=call.num_rows))
        if staged is not call:
            call.out.copy_(staged.out)
    elif launch:
        # No element to write (T = 0 or H = 0); the positions are still checked.
        with_values(token_topk_to_pos, functools.partial(_check_positions, num_rows=call.num_rows))
    return call.out


def _check_positions(values: list, num_rows: int) -> None:
    words = [0] * (STATUS_BAD_INDEX + 1)
    words[STATUS_BAD_INDEX] = int(any(p < -1 or p >= num_rows for row in values for p in row))
    _raise_bad_positions(words, num_rows)


# --- the vmi command -------------------------------------------------------------------------------

# Slots left unused (-1), as the tokens routed to experts of other ranks leave them.
UNUSED_FRACTION = 0.125
DTYPES = ("bf16", "fp32", "e4m3")
# The slot counts the command offers (each a kernel): the gate's, with shared experts, the edges.
TOPK_CHOICES = (1, 2, 4, 6, 8, 9, 16, 32)


def placement(num_tokens: int, num_topk: int, num_rows: int, seed: int,
              unused: float = UNUSED_FRACTION) -> torch.Tensor:
    """int32 ``[T, K]``: the slots placed on distinct random rows of ``[0, num_rows)`` (``num_rows >=
    T·K``), a fraction ``unused`` of them -1."""
    g = generator(seed)
    pos = torch.randperm(max(num_rows, 1), generator=g)[:num_tokens * num_topk].view(num_tokens, num_topk)
    pos = torch.where(torch.rand(num_tokens, num_topk, generator=g) < unused, -1, pos)
    return pos.to(torch.int32).contiguous()


def _inputs(shape, options, seed):
    num_tokens, hidden = shape
    k, fmt = options["num_topk"], options["dtype"]
    g = generator(seed)
    num_rows = num_tokens * k
    rows = torch.randn(num_rows, hidden, generator=g)
    scaled = options["with_x_sf"] or fmt == "e4m3"
    x_sf = torch.rand(num_rows, generator=g) + 0.5 if scaled else None
    if fmt == "e4m3":
        rows = rows * 64
    inputs = {"x": rows.to(_DTYPE_OF[fmt]), "x_sf": x_sf,
              "topk_weights": torch.rand(num_tokens, k, generator=g) if options["with_weights"] else None,
              "token_topk_to_pos": placement(num_tokens, k, num_rows, seed + 1),
              "sf": torch.rand(1, generator=g) * 4 if options["with_sf"] else None}
    return inputs


def _nbytes(inputs, outputs) -> int:
    """Bytes moved: the used rows of x (and their scales), the tables, the output."""
    x, pos = inputs["x"], inputs["token_topk_to_pos"]
    used = int((pos >= 0).sum())
    total = used * x.shape[1] * x.element_size() + pos.numel() * 4 + outputs[0].numel() * outputs[0].element_size()
    total += used * 4 if inputs["x_sf"] is not None else 0
    total += inputs["topk_weights"].numel() * 4 if inputs["topk_weights"] is not None else 0
    return total


def _kernels(options, target, flavor):
    in_fmt = options["dtype"]
    out_fmt = "e4m3" if options["fp8_format"] == "e4m3" else in_fmt
    return [(parallel.build_reduce_fused, parallel.ReduceFusedSpec(options["num_topk"], in_fmt, out_fmt))]


REDUCE_FUSED = KernelOp(
    OP,
    (Param("x", "Tensor"), Param("x_sf", "Tensor", optional=True), Param("topk_weights", "Tensor", optional=True),
     Param("token_topk_to_pos", "Tensor"), Param("fp8_format", "str", ""), Param("sf", "Tensor", None, optional=True)),
    ("out",), _run, outs=("out",),
    command=Command(
        summary="the expanded expert rows summed back per token: weighted, in slot order with fused multiply-adds",
        support=SIMT_SUPPORT,
        default_shape=(1024, 4096),
        bench_shapes=((2048, 7168), (1024, 4096), (1, 7168), (4, 7168), (16, 7168)),
        make_inputs=_inputs,
        kernels=_kernels,
        options=(
            Option("num_topk", 8, TOPK_CHOICES, "slots per token (the op takes 1 to 32)"),
            Option("dtype", "bf16", DTYPES, "the expanded rows' dtype (e4m3 comes with x_sf)"),
            Option("fp8_format", "", FP8_FORMATS, "'' (the rows' dtype) or 'e4m3' output"),
            Option("with_weights", True, help="topk_weights (else every weight 1)"),
            Option("with_x_sf", False, help="per-row scales of the expanded rows"),
            Option("with_sf", False, help="an output scale sf (needs fp8_format=e4m3)"),
        ),
        nbytes=_nbytes,
    ))


def reduce_fused(x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], topk_weights: torch.Tensor | None,
                 token_topk_to_pos: torch.Tensor, fp8_format: str = "", sf: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, *, target: str | None = None,
                 flavor: str | None = None) -> torch.Tensor:
    """Sum the expanded expert rows back per token: ``out[t] = Σ_k s[t, k] · x[pos[t, k]]``.

    Per token, in fp32: ``acc = +0.0``; for each slot ``k`` in order whose position
    ``pos = token_topk_to_pos[t, k]`` is not -1, ``s = w[t, k]`` (1.0 without weights), times
    ``x_sf[pos]`` (one rounding) when ``x`` carries scales, and ``acc = fma(x[pos], s, acc)`` (one
    rounding); then ``acc · sf[0]`` when ``sf`` is given, and the cast to the output dtype (bf16
    round to nearest even; E4M3 as ``.to(torch.float8_e4m3fn)``: saturating to +-448, NaN kept).
    Every target and flavor computes this chain: the kernels equal the reference bit for bit.
    A token without a used slot gets +0.0 (then ``sf``, then the cast). Non-finite values
    propagate as IEEE arithmetic gives them (no check); a NaN output has unspecified sign and payload.

    Args:
        x: The expanded rows, contiguous ``[N, H]`` float32 or bfloat16; or a pair ``(data, x_sf)``
            of such rows (or float8_e4m3fn rows) and their fp32 scales ``[N]`` (contiguous).
        topk_weights: fp32 ``[T, K]`` contiguous, or None (every weight 1).
        token_topk_to_pos: int32 ``[T, K]`` contiguous, ``1 <= K <= 32``: the row of ``x`` holding
            each slot's expert output, -1 for an unused slot.
        fp8_format: ``""`` (output in the dtype of ``x``'s rows) or ``"e4m3"`` (float8_e4m3fn).
        sf: fp32 ``[1]``, the output scale; only with ``fp8_format="e4m3"``.
        out: Optional contiguous ``[T, H]`` output of the output dtype, sharing no memory with an
            input; written only when the call succeeds.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the
            device of ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``). Both flavors give the same bits here.

    Returns:
        ``out``: the given tensor, written, or a new contiguous ``[T, H]`` tensor.

    Raises:
        TypeError: ``x`` (or its data) is not a tensor or has another dtype (float8_e4m3fn rows need
            scales); another tensor argument has the wrong dtype; ``fp8_format`` is not a str.
        ValueError: ``x`` is not a pair of two or not 2-D contiguous, or too large for 32-bit kernel
            offsets; a tensor has the wrong shape, is not contiguous or is on another device;
            ``token_topk_to_pos`` has no or more than 32 columns; ``fp8_format`` is not ``""`` or
            ``"e4m3"``; ``sf`` is given without ``fp8_format="e4m3"``; ``out`` shares memory with an
            input.
        ValueError: ``token_topk_to_pos`` holds a position outside ``[-1, N)`` (found by the kernel,
            which reads and writes nothing outside the tensors; a given ``out`` is left as it was).
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ValueError(f"x must be a tensor or a (data, x_sf) pair, got a tuple of {len(x)}")
        data, x_sf = x
        if x_sf is None:
            raise TypeError("x_sf (the second entry of x) must be a torch.Tensor, got None")
    else:
        data, x_sf = x, None
    return REDUCE_FUSED(data, x_sf, topk_weights, token_topk_to_pos, fp8_format, sf,
                        out=None if out is None else (out,), target=target, flavor=flavor)


reduce_fused_parallel = parallel_entry(reduce_fused, "x")
