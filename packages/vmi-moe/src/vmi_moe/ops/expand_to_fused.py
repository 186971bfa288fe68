"""``expand_to_fused`` and ``expand_to_fused_with_sf``: public dispatch (validation, allocation, backend choice).

Copies each token's row (and its per-token scaling factors) to the rows of the fused expert layout
that its slots occupy, and zero rows into the layout's padding (``docs/moe/expand_to_fused.md``).
Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions (see
vmi_core.targets).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_bool, check_int_choice, check_kernel_extent, check_tensor
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.plan import with_values
from vmi_core.targets import resolve_flavor, resolve_target
from vmi_core.tools.testing import generator

from ..inputs import MAX_TOPK
from ..kernels import expand_to_fused as parallel
from ..reference import expand as reference
from ..reference import mapping as reference_mapping

# The data dtypes: copied as bit patterns, so any 1-, 2- or 4-byte float.
DATA_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)
# The per-token SF words and the SF values each holds: fp32, or packed UE8M0 exponents (four per
# int32 word, TileKernels' and vmi's cuda flavor; two per int16 word, vmi's ascend flavor).
SF_PACK = {torch.float32: 1, torch.int32: 4, torch.int16: 2}
# vmi-quant's per_token_cast: the channel groups that give one SF row per token.
NUM_PER_CHANNELS = (16, 32, 64, 128)


def hidden_sf_words(hidden: int, num_per_channels: int, sf_dtype: torch.dtype) -> int:
    """SF words per token: ``ceil(H / num_per_channels)`` values, packed ``SF_PACK`` to a word."""
    groups = -(-hidden // num_per_channels)
    return -(-groups // SF_PACK[sf_dtype])


@dataclass
class ExpandCall:
    """A validated call: the kernel specialisation plus the tensors it reads and writes.

    ``num_rows``: the rows a launch covers, ``max(T, sf_rows)``; ``sf_rows``: the output positions
    whose SF the kernel writes (``N``, or the column-major buffer's aligned row count); ``status``:
    a row of status words per work tile (``vmi_moe.kernels.expand_to_fused``)."""

    spec: parallel.ExpandSpec
    x: torch.Tensor
    token_topk_to_pos: torch.Tensor
    pos_to_expert: torch.Tensor
    out: torch.Tensor
    status: torch.Tensor
    num_rows: int
    sf_rows: int
    sf: torch.Tensor | None = None
    out_sf_storage: torch.Tensor | None = None
    out_sf_strides: tuple[int, int] = (0, 0)


def _check_words(t: torch.Tensor, name: str, word_bytes: int) -> None:
    """``t``'s words (the kernel's unit) are addressable with int32 offsets."""
    words = t.numel() * t.element_size() // word_bytes
    if words - 1 > INT32_MAX:
        raise ValueError(f"{name} is too large for the kernels, which address it with 32-bit offsets "
                         f"({words} {word_bytes}-byte words, shape {tuple(t.shape)})")


def _check_mapping(x, token_topk_to_pos, pos_to_expert, x_name: str) -> tuple[int, int, int]:
    check_tensor(x, x_name, dtype=DATA_DTYPES, shape=(None, None), contiguous=True)
    device = x.device
    num_tokens = x.shape[0]
    check_tensor(token_topk_to_pos, "token_topk_to_pos", dtype=torch.int32, shape=(None, None), device=device,
                 contiguous=True)
    if token_topk_to_pos.shape[0] != num_tokens:
        raise ValueError(f"token_topk_to_pos must have one row per token of {x_name} ({num_tokens}), "
                         f"got {token_topk_to_pos.shape[0]}")
    num_topk = token_topk_to_pos.shape[1]
    if not 1 <= num_topk <= MAX_TOPK:
        raise ValueError(f"token_topk_to_pos must have 1 to {MAX_TOPK} columns, got {num_topk}")
    check_tensor(pos_to_expert, "pos_to_expert", dtype=torch.int32, shape=(None,), device=device, contiguous=True)
    check_kernel_extent(token_topk_to_pos, "token_topk_to_pos")
    return num_tokens, num_topk, pos_to_expert.shape[0]


def _prepare(x, token_topk_to_pos, pos_to_expert, target, flavor, x_name: str = "x", sf=None,
             num_per_channels=None, col_major=False):
    target = resolve_target(x, target)
    flavor = resolve_flavor(target, flavor)
    num_tokens, num_topk, num_expanded = _check_mapping(x, token_topk_to_pos, pos_to_expert, x_name)
    hidden = x.shape[1]
    word_bytes = parallel.word_bytes_of(hidden * x.element_size())
    out = torch.empty((num_expanded, hidden), dtype=x.dtype, device=x.device)
    _check_words(x, x_name, word_bytes)
    _check_words(out, "the expanded output", word_bytes)
    sf_rows = num_expanded
    extra = {}
    if sf is not None:
        if not isinstance(sf, torch.Tensor):
            raise TypeError(f"x sf must be a torch.Tensor, got {type(sf).__name__}")
        if sf.dtype not in SF_PACK:
            raise TypeError(f"x sf must be float32, or packed UE8M0 words int32 (4 per word) or int16 (2 per "
                            f"word), got {sf.dtype}")
        num_per_channels = check_int_choice(num_per_channels, "num_per_channels", NUM_PER_CHANNELS)
        col_major = check_bool(col_major, "use_tma_aligned_col_major_sf")
        hidden_sf = hidden_sf_words(hidden, num_per_channels, sf.dtype)
        check_tensor(sf, "x sf", shape=(num_tokens, hidden_sf), device=x.device)
        if sf.numel() > 1 and sf.stride(1) != 1 and sf.stride(0) != 1:
            raise ValueError(f"x sf must be row-major or column-major, got strides {tuple(sf.stride())}")
        check_kernel_extent(sf, "x sf")
        sf_bytes = sf.element_size()
        if col_major:
            sf_rows = -(-num_expanded // flavor.col_major_align(sf_bytes)) * flavor.col_major_align(sf_bytes)
            storage = torch.empty((hidden_sf, sf_rows), dtype=sf.dtype, device=x.device)
            out_sf = storage[:, :num_expanded].t()
            if num_expanded == 0 or hidden_sf == 0:
                out_sf = torch.as_strided(storage, (num_expanded, hidden_sf), (1, max(sf_rows, 1)))
            strides = (1, sf_rows)
        else:
            storage = out_sf = torch.empty((num_expanded, hidden_sf), dtype=sf.dtype, device=x.device)
            strides = (hidden_sf, 1)
        check_kernel_extent(storage, "the expanded SF")
        extra = dict(sf=sf, out_sf_storage=storage, out_sf_strides=strides)
    num_rows = max(num_tokens, sf_rows)
    tiles = -(-num_rows // parallel.BLOCK_M)
    spec = parallel.ExpandSpec(num_topk, word_bytes, *((sf.element_size(),) if sf is not None else ()))
    # Every work tile writes its row (flags, balance).
    status = torch.empty((tiles, parallel.TILE_STATUS_WORDS), dtype=torch.int32, device=x.device)
    call = ExpandCall(spec, x, token_topk_to_pos, pos_to_expert, out, status, num_rows, sf_rows, **extra)
    return target, call, (out_sf if sf is not None else None)


def _raise_flags(rows: list[list[int]], op: str) -> None:
    flags = functools.reduce(operator.or_, (row[parallel.TILE_FLAGS] for row in rows), 0)
    errors = []
    if flags & parallel.FLAG_BAD_POSITION:
        errors.append("token_topk_to_pos holds positions outside [-1, pos_to_expert.size(0))")
    if flags & parallel.FLAG_PADDING_TARGET:
        errors.append("token_topk_to_pos places slots on padding rows (pos_to_expert < 0)")
    if not errors and sum(row[parallel.TILE_BALANCE] for row in rows):
        errors.append("token_topk_to_pos places a different number of slots than pos_to_expert has non-padding "
                      "rows (a non-padding row no slot targets, or two slots on one row)")
    if errors:
        raise ValueError(f"{op}: " + "; ".join(errors) + " (not a get_fused_mapping layout)")


def _launch(call: ExpandCall, target: str, op: str) -> None:
    parallel.launch(call, target)
    with_values(call.status, functools.partial(_raise_flags, op=op))


def _run(x, token_topk_to_pos, pos_to_expert, *, out, target, flavor, launch):
    target, call, _ = _prepare(x, token_topk_to_pos, pos_to_expert, target, flavor)
    if launch and target == "torch":
        call.out.copy_(reference.expand_to_fused(x, token_topk_to_pos, pos_to_expert))
    elif launch:
        _launch(call, target, "expand_to_fused")
    return call.out


def _run_with_sf(x_data, x_sf, num_per_channels, token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf,
                 *, out, target, flavor, launch):
    target, call, out_sf = _prepare(x_data, token_topk_to_pos, pos_to_expert, target, flavor, "x data", x_sf,
                                    num_per_channels, use_tma_aligned_col_major_sf)
    if launch and target == "torch":
        rows = call.sf_rows if use_tma_aligned_col_major_sf else None
        data, sf = reference.expand_to_fused_with_sf((x_data, x_sf), token_topk_to_pos, pos_to_expert, rows)
        call.out.copy_(data)
        call.out_sf_storage.zero_()
        out_sf.copy_(sf)
    elif launch:
        _launch(call, target, "expand_to_fused_with_sf")
    return call.out, out_sf


# --- the vmi command -------------------------------------------------------------------------------------------------

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn,
           "e5m2": torch.float8_e5m2}
_SF_WORDS = {"fp32": torch.float32, "ue8m0": torch.int32}
_SUPPORT = support("SIMT region for the zero tile and the SF words; data rows by DMA from scalar code",
                   cpu="bit-exact against the reference in both flavors",
                   ascend_sim="bit-exact against the reference (ascend flavor)")
_DEFAULT_SHAPE = (1024, 4096)
# Prefill sizes (bytes per second) and decode sizes (microseconds per call).
_BENCH_SHAPES = ((4096, 7168), (1024, 4096), (16, 7168), (1, 7168))
_MAPPING_OPTIONS = (
    Option("num_topk", 8, (1, 2, 4, 6, 8, 16, 32), "slots per token"),
    Option("num_experts", 256, help="experts of the layout"),
    Option("alignment", 16, help="rows of an expert's range are a multiple of this"),
)


def demo_mapping(num_tokens: int, options, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_topk_to_pos, pos_to_expert)`` of a random routing (distinct experts per token, a few
    unused slots) laid out by the reference ``get_fused_mapping``."""
    num_topk, num_experts, alignment = options["num_topk"], options["num_experts"], options["alignment"]
    g = generator(seed)
    scores = torch.rand(num_tokens, num_experts, generator=g)
    topk_idx = scores.topk(min(num_topk, num_experts), dim=1).indices
    if num_topk > num_experts:
        topk_idx = torch.cat([topk_idx, topk_idx.new_full((num_tokens, num_topk - num_experts), -1)], dim=1)
    topk_idx[torch.rand(num_tokens, num_topk, generator=g) < 0.02] = -1
    needed = int(-(-torch.bincount(topk_idx[topk_idx >= 0], minlength=num_experts) // alignment).sum()) * alignment
    mapping = reference_mapping.get_fused_mapping(topk_idx, num_experts, needed, alignment)
    return mapping[3].contiguous(), mapping[0].contiguous()


def _data(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=generator(seed)).to(dtype)


def _inputs(shape, options, seed):
    pos, pte = demo_mapping(shape[0], options, seed + 1)
    return {"x": _data(shape, _DTYPES[options["dtype"]], seed), "token_topk_to_pos": pos, "pos_to_expert": pte}


def _kernels(options, target, flavor):
    row_bytes = _DEFAULT_SHAPE[1] * _DTYPES[options["dtype"]].itemsize
    return [(parallel.build_expand_to_fused,
             parallel.ExpandSpec(options["num_topk"], parallel.word_bytes_of(row_bytes)))]


EXPAND_TO_FUSED = KernelOp(
    "expand_to_fused", (Param("x", "Tensor"), Param("token_topk_to_pos", "Tensor"), Param("pos_to_expert", "Tensor")),
    ("expanded",), _run,
    command=Command(
        summary="token rows copied to their slots' rows of the fused expert layout, padding rows zero",
        support=_SUPPORT,
        default_shape=_DEFAULT_SHAPE,
        bench_shapes=_BENCH_SHAPES,
        make_inputs=_inputs,
        kernels=_kernels,
        options=(*_MAPPING_OPTIONS, Option("dtype", "bf16", tuple(_DTYPES), "dtype of x")),
    ))


def _sf_inputs(shape, options, seed):
    num_tokens, hidden = shape
    pos, pte = demo_mapping(num_tokens, options, seed + 1)
    npc, word = options["num_per_channels"], _SF_WORDS[options["sf"]]
    hidden_sf = hidden_sf_words(hidden, npc, word)
    g = generator(seed + 2)
    if word == torch.float32:
        sf = torch.exp2(torch.randint(-20, 20, (num_tokens, hidden_sf), generator=g).float())
    else:
        sf = torch.randint(-(2**31), 2**31 - 1, (num_tokens, hidden_sf), generator=g, dtype=torch.int64).to(word)
    if options["use_tma_aligned_col_major_sf"]:
        sf = sf.t().contiguous().t()  # as per_token_cast lays a column-major SF out
    return {"x_data": _data(shape, torch.float8_e4m3fn, seed), "x_sf": sf, "token_topk_to_pos": pos,
            "pos_to_expert": pte}


def _sf_kernels(options, target, flavor):
    return [(parallel.build_expand_to_fused, parallel.ExpandSpec(options["num_topk"], 4))]


EXPAND_TO_FUSED_WITH_SF = KernelOp(
    "expand_to_fused_with_sf",
    (Param("x_data", "Tensor"), Param("x_sf", "Tensor"), Param("num_per_channels", "int"),
     Param("token_topk_to_pos", "Tensor"), Param("pos_to_expert", "Tensor"),
     Param("use_tma_aligned_col_major_sf", "bool", False)),
    ("expanded", "expanded_sf"), _run_with_sf,
    command=Command(
        summary="quantized token rows and their per-token scaling factors copied to the fused expert layout",
        support=_SUPPORT,
        default_shape=_DEFAULT_SHAPE,
        bench_shapes=_BENCH_SHAPES,
        make_inputs=_sf_inputs,
        kernels=_sf_kernels,
        options=(*_MAPPING_OPTIONS,
                 Option("num_per_channels", 128, NUM_PER_CHANNELS, "channels per scaling factor"),
                 Option("sf", "fp32", tuple(_SF_WORDS), "SF words: fp32, or packed UE8M0 int32"),
                 Option("use_tma_aligned_col_major_sf", False, help="column-major SF (input and output)")),
    ))


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor, *,
                    target: str | None = None, flavor: str | None = None) -> torch.Tensor:
    """Expand token rows into the fused expert layout: ``expanded[p] = x[t]`` for the slot ``(t, k)``
    with ``token_topk_to_pos[t, k] == p``; padding rows (``pos_to_expert[p] < 0``) are zero.

    Rows are copied as bit patterns (NaN payloads and signed zeros kept); padding rows are all zero
    bits. The mapping is meant to be ``get_fused_mapping``'s: every row is padding or the target of
    exactly one slot. The kernel checks that each slot's position lies in ``[-1, N)`` and is not a
    padding row, and that the slots placed are as many as the non-padding rows; it does not see
    a row that two slots target while another non-padding row has none (such a row is written by
    one of the two, the other holds unspecified bits).

    Args:
        x: Contiguous ``[T, H]``, float32, bfloat16, float16, float8_e4m3fn or float8_e5m2.
        token_topk_to_pos: Contiguous int32 ``[T, K]``, ``1 <= K <= 32``: each slot's row of the
            layout, ``-1`` for a slot not placed.
        pos_to_expert: Contiguous int32 ``[N]``: each row's expert, negative for a padding row.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of ``x``.
        flavor: Bit conventions (see ``vmi_core.targets``); no bit of this op depends on it.

    Returns:
        New ``[N, H]`` tensor of ``x``'s dtype, contiguous.

    Raises:
        TypeError: A tensor argument is not a tensor or has another dtype.
        ValueError: ``x`` or ``token_topk_to_pos`` is not 2-D or not contiguous, ``pos_to_expert`` is
            not 1-D or not contiguous; ``token_topk_to_pos`` has another row count than ``x`` or
            fewer than 1 or more than 32 columns; a tensor is on another device than ``x``; ``x`` or
            the output is too large for 32-bit offsets.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
        ValueError: After the kernel ran: a slot position outside ``[-1, N)``; a slot on a padding
            row; placed slots and non-padding rows of different counts.
    """
    return EXPAND_TO_FUSED(x, token_topk_to_pos, pos_to_expert, target=target, flavor=flavor)


def expand_to_fused_with_sf(x: tuple[torch.Tensor, torch.Tensor], num_per_channels: int,
                            token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
                            use_tma_aligned_col_major_sf: bool = False, *, target: str | None = None,
                            flavor: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``expand_to_fused`` of a quantized ``x = (data, sf)``: the data rows and each token's scaling
    factors go to the rows its slots occupy; padding rows get zero data and zero SF words.

    Args:
        x: ``(data, sf)``: data as ``expand_to_fused``'s ``x`` (``[T, H]``, typically float8_e4m3fn);
            sf ``[T, hidden_sf]`` per-token scaling factors, float32 with
            ``hidden_sf = ceil(H / num_per_channels)``, or packed UE8M0 words, int32 (4 exponents per
            word) or int16 (2 per word, vmi's ascend flavor) with ``hidden_sf`` the words of those
            exponents; row-major or column-major (any strides with one of them 1), as
            ``vmi_quant.per_token_cast`` returns it.
        num_per_channels: Channels per scaling factor: 16, 32, 64 or 128.
        token_topk_to_pos: As for ``expand_to_fused``.
        pos_to_expert: As for ``expand_to_fused``.
        use_tma_aligned_col_major_sf: The output SF's layout: False: row-major ``[N, hidden_sf]``;
            True: the transposed view of a ``[hidden_sf, align(N, a)]`` buffer (``a``: the flavor's
            column-major alignment, 4 words of 4 bytes in the cuda flavor, as TileKernels; 1 in the
            ascend flavor), whose alignment rows are zero.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device
            of the data.
        flavor: Bit conventions (see ``vmi_core.targets``): the column-major alignment.

    Returns:
        expanded: New ``[N, H]`` tensor of the data's dtype.
        expanded_sf: New ``[N, hidden_sf]`` SF of ``sf``'s dtype, in the layout asked for.

    Raises:
        TypeError: ``x`` is not a tuple; ``num_per_channels`` is not an int;
            ``use_tma_aligned_col_major_sf`` is not a bool; a tensor has a wrong dtype; otherwise as
            ``expand_to_fused``.
        ValueError: ``x`` is not a pair; ``num_per_channels`` is not 16, 32, 64 or 128; the sf has
            another shape than ``[T, hidden_sf]``, is neither row- nor column-major, or is on another
            device; otherwise as ``expand_to_fused``.
    """
    if not isinstance(x, tuple):
        raise TypeError(f"x must be a quantized (data, sf) tuple, got {type(x).__name__}")
    if len(x) != 2:
        raise ValueError(f"x must be a quantized (data, sf) tuple, got a tuple of {len(x)}")
    return EXPAND_TO_FUSED_WITH_SF(x[0], x[1], num_per_channels, token_topk_to_pos, pos_to_expert,
                                   use_tma_aligned_col_major_sf, target=target, flavor=flavor)


expand_to_fused_parallel = parallel_entry(expand_to_fused, "x")
expand_to_fused_with_sf_parallel = parallel_entry(expand_to_fused_with_sf, "x")
