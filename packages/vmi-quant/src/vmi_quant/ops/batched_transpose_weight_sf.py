"""``batched_transpose_weight_sf``: public dispatch (validation, allocation, backend choice).

Turns the fp32 power-of-two block scales of a list of weights into the packed UE8M0 SF of each
weight (packed along K, one row per weight row) and of its transpose (packed along N).
Names and parameters follow TileKernels v2; ``target`` and ``flavor`` are vmi's additions.

As a torch custom op the call is ``torch.ops.vmi.batched_transpose_weight_sf(sf, block_size,
transpose_sf1s)``, which returns the one flat pool that holds every output (torch does not let
a custom op return tensors that share memory with each other, and the outputs of one call are
views of one pool), and ``.out(..., outs=[sf0, sf1, ...])``, which writes given outputs in
place (a mutable ``Tensor[]``). The public function makes the views of the pool, and calls
``.out`` when the caller reuses outputs (new ones allocated, in a pool of their own, for the
weights whose entry of ``outs`` is None).

Bad scales (not +0 or a finite positive power of two) are found by the kernel, which raises a
status word per weight; the call then raises ``ValueError`` naming the weight. Outputs the
caller passed in are never partly written: with ``outs``, the kernel writes into a scratch pool
(staging), and the given outputs are copied from it only when no weight was flagged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vmi_core.checks import INT32_MAX, check_disjoint, check_kernel_extent, check_tensor, is_traced
from vmi_core.library import Command, KernelOp, Option, Param, parallel_entry, support
from vmi_core.plan import with_values
from vmi_core.targets import Flavor, resolve_flavor, resolve_target
from vmi_core.tools.testing import generator, randn

from ..kernels import batched_transpose_weight_sf as parallel
from ..reference.cast import cast as reference_cast
from ..reference.transpose import batched_transpose_weight_sf as reference_transpose

# Every weight dimension is a multiple of this; so is every output's size in elements, which keeps
# each output of a pool 32-byte aligned.
ALIGN = 128
ALIGN_BYTES = 32


@dataclass
class Weight:
    """One validated weight: its scales as ``(G, n/bs, k/bs)`` and its outputs' shapes and strides."""

    sf: torch.Tensor
    grouped: bool
    sf0_shape: tuple
    sf0_strides: tuple
    sf1_shape: tuple
    sf1_strides: tuple

    @property
    def sf0_numel(self) -> int:
        return math.prod(self.sf0_shape)

    @property
    def sf1_numel(self) -> int:
        return math.prod(self.sf1_shape)


def _weight(sf, index: int, block_size: int, transpose_sf1, flavor: Flavor, device) -> Weight:
    name = f"sf[{index}]"
    check_tensor(sf, name, dtype=torch.float32, device=device)
    check_kernel_extent(sf, name)
    if sf.dim() not in (2, 3):
        raise ValueError(f"{name} must be (n/bs, k/bs) or (G, n/bs, k/bs), got shape {tuple(sf.shape)}")
    if not sf.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tuple(sf.stride())}")
    grouped = sf.dim() == 3
    if grouped and sf.shape[0] == 0:
        raise ValueError(f"{name} must have at least one group, got shape {tuple(sf.shape)}")
    if not isinstance(transpose_sf1, bool):
        raise TypeError(f"transpose_sf1s[{index}] must be a bool, got {type(transpose_sf1).__name__}")
    num_sf_n, num_sf_k = sf.shape[-2:]
    n, k = num_sf_n * block_size, num_sf_k * block_size
    if n % ALIGN or k % ALIGN:
        raise ValueError(f"{name}: the weight's n = {num_sf_n} x {block_size} and k = {num_sf_k} x {block_size} "
                         f"must be multiples of {ALIGN}, got {n} x {k}")
    pf = flavor.ue8m0_pack
    p0, p1 = -(-num_sf_k // pf), -(-num_sf_n // pf)
    groups = sf.shape[0] if grouped else 1
    if max(groups * p0 * n, groups * p1 * k) > INT32_MAX:
        raise ValueError(f"{name}: the outputs of a {groups} x {n} x {k} weight are too large for the kernels, "
                         f"which address a tensor with 32-bit offsets")
    head = tuple(sf.shape[:1]) if grouped else ()
    sf0_shape, sf0_strides = (*head, n, p0), (p0 * n, 1, n)
    if transpose_sf1:
        sf1_shape, sf1_strides = (*head, p1, k), (p1 * k, k, 1)
    else:
        sf1_shape, sf1_strides = (*head, k, p1), (p1 * k, 1, k)
    return Weight(sf if grouped else sf.unsqueeze(0), grouped, sf0_shape, sf0_strides[-len(sf0_shape):],
                  sf1_shape, sf1_strides[-len(sf1_shape):])


def _prepare(sf, block_size, transpose_sf1s, target, flavor) -> tuple[str, Flavor, list[Weight], torch.device]:
    if not isinstance(sf, (list, tuple)):
        raise TypeError(f"sf must be a sequence of tensors, got {type(sf).__name__}")
    if not isinstance(transpose_sf1s, (list, tuple)):
        raise TypeError(f"transpose_sf1s must be a sequence of bools, got {type(transpose_sf1s).__name__}")
    if len(transpose_sf1s) != len(sf):
        raise ValueError(f"transpose_sf1s must have one entry per weight ({len(sf)}), got {len(transpose_sf1s)}")
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size not in parallel.BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {parallel.BLOCK_SIZES}, got {block_size}")
    if sf and not isinstance(sf[0], torch.Tensor):
        raise TypeError(f"sf[0] must be a torch.Tensor, got {type(sf[0]).__name__}")
    device = sf[0].device if sf else torch.device("cpu")
    target = resolve_target(sf[0] if sf else torch.empty(0), target)
    flavor = resolve_flavor(target, flavor)
    weights = [_weight(s, i, block_size, t, flavor, device)
               for i, (s, t) in enumerate(zip(sf, transpose_sf1s, strict=True))]
    return target, flavor, weights, device


def _views(pool: torch.Tensor, weights: Sequence[Weight]) -> list[torch.Tensor]:
    """``[sf0, sf1, ...]``: each weight's outputs in ``pool``, ``sf0`` at the running offset and
    ``sf1`` right after it."""
    views, offset = [], 0
    for w in weights:
        for shape, strides, numel in ((w.sf0_shape, w.sf0_strides, w.sf0_numel),
                                      (w.sf1_shape, w.sf1_strides, w.sf1_numel)):
            views.append(torch.as_strided(pool, shape, strides, offset))
            offset += numel
    return views


def _pool(weights: Sequence[Weight], flavor: Flavor, device) -> torch.Tensor:
    return torch.empty(sum(w.sf0_numel + w.sf1_numel for w in weights), dtype=flavor.ue8m0_word_dtype,
                       device=device)


def _out_names(weights: Sequence[Weight]) -> list[str]:
    return [f"outs[{i}] {which}" for i in range(len(weights)) for which in ("sf0_out", "sf1_out")]


def _check_outs(outs: Sequence[torch.Tensor], weights: Sequence[Weight], flavor: Flavor, device) -> None:
    if len(outs) != 2 * len(weights):
        raise ValueError(f"outs must hold an (sf0_out, sf1_out) pair per weight ({len(weights)}), "
                         f"got {len(outs)} tensors")
    layouts = [layout for w in weights for layout in ((w.sf0_shape, w.sf0_strides), (w.sf1_shape, w.sf1_strides))]
    for out, name, (shape, strides) in zip(outs, _out_names(weights), layouts, strict=True):
        check_tensor(out, name, dtype=flavor.ue8m0_word_dtype, device=device)
        if tuple(out.shape) != shape or tuple(out.stride()) != strides:
            raise ValueError(f"{name} must have shape {shape} and strides {strides} (as this call returns "
                             f"it), got shape {tuple(out.shape)} and strides {tuple(out.stride())}")
        if not is_traced(out) and out.data_ptr() % ALIGN_BYTES:
            raise ValueError(f"{name} must start at a {ALIGN_BYTES}-byte aligned address")
    check_disjoint(dict(zip(_out_names(weights), outs, strict=True)),
                   {f"sf[{i}]": w.sf for i, w in enumerate(weights)})


def _storage(out: torch.Tensor, grouped: bool) -> torch.Tensor:
    """The ``(G, words, rows)`` storage of an output, whichever way it is viewed."""
    storage = out if out.stride(-1) == 1 else out.transpose(-1, -2)
    return storage if grouped else storage.unsqueeze(0)


def _launch(weights: Sequence[Weight], outs: Sequence[torch.Tensor], block_size: int, flavor: Flavor,
            target: str) -> None:
    spec = parallel.TransposeSpec(block_size, flavor.ue8m0_pack)
    status = torch.zeros(len(weights), dtype=torch.int32, device=weights[0].sf.device)
    for i, w in enumerate(weights):
        parallel.launch(spec, w.sf, _storage(outs[2 * i], w.grouped), _storage(outs[2 * i + 1], w.grouped),
                        status[i:i + 1], target)
    with_values(status, _raise_flagged)


def _raise_flagged(words: list[int]) -> None:
    flagged = [f"sf[{i}]" for i, word in enumerate(words) if word]
    if flagged:
        raise ValueError(f"batched_transpose_weight_sf: {', '.join(flagged)} must hold +0 or positive powers of "
                         f"two (UE8M0 scales): a scale has a sign or mantissa bit, or is inf or NaN")


def _run_reference(sf, block_size, transpose_sf1s, flavor: Flavor, outs: Sequence[torch.Tensor]) -> None:
    expected = reference_transpose(sf, block_size, transpose_sf1s, flavor=flavor)
    for i, (sf0, sf1) in enumerate(expected):
        outs[2 * i].copy_(sf0)
        outs[2 * i + 1].copy_(sf1)


def _run(sf, block_size, transpose_sf1s, *, out, target, flavor, launch):
    target, flavor, weights, device = _prepare(sf, block_size, transpose_sf1s, target, flavor)
    if out is None:
        pool = _pool(weights, flavor, device)
        outs = _views(pool, weights)
    else:
        (outs,) = out
        _check_outs(outs, weights, flavor, device)
        pool = None
    if launch and weights:
        if target == "torch":
            _run_reference(sf, block_size, transpose_sf1s, flavor, outs)
        elif out is None:
            _launch(weights, outs, block_size, flavor, target)
        else:
            # Given outputs: staged, so a flagged weight leaves every one of them as it was.
            staged = _views(_pool(weights, flavor, device), weights)
            _launch(weights, staged, block_size, flavor, target)
            for given, written in zip(outs, staged, strict=True):
                given.copy_(written)
    return pool


_OPTIONS = (
    Option("block_size", 32, (32, 128), "weight rows and columns per scaling block"),
    Option("num_weights", 4, help="weights of the shape, each with its own scales"),
    Option("num_groups", 0, help="groups per weight: (G, n/bs, k/bs) scales (0: 2-D scales)"),
    Option("transpose_sf1", False, help="return each transposed weight's SF as (P1, k)"),
)


def _inputs(shape, options, seed):
    # The power-of-two block scales a per-block cast gives each weight (n, k) = shape, G at a time;
    # rows and columns of the weights spread over 2^-8 .. 2^8, so the exponents vary by block.
    n, k = shape
    bs, groups = options["block_size"], options["num_groups"]
    sf = []
    for i in range(options["num_weights"]):
        rows = max(groups, 1) * n
        g = generator(seed + i)
        spread = torch.randint(-4, 5, (rows, 1), generator=g) + torch.randint(-4, 5, (1, k), generator=g)
        _, scales = reference_cast(randn((rows, k), seed + i) * torch.exp2(spread.float()), "e4m3", (bs, bs),
                                   round_sf=True)
        sf.append(scales.view(groups, n // bs, k // bs) if groups else scales)
    return {"sf": sf}


def _kernels(options, target, flavor):
    spec = parallel.TransposeSpec(options["block_size"], resolve_flavor(target, flavor).ue8m0_pack)
    return [(parallel.build_batched_transpose_weight_sf, spec)]


BATCHED_TRANSPOSE_WEIGHT_SF = KernelOp(
    "batched_transpose_weight_sf",
    (Param("sf", "Tensor[]"), Param("block_size", "int"), Param("transpose_sf1s", "bool[]")),
    ("pool",), _run, outs=("outs",), out_list=True,
    command=Command(
        summary="packed UE8M0 SF of weights (n, k) and of their transposes from power-of-two block scales",
        support=support("SIMT and SIMD vector regions",
                        cpu="bit-exact against the reference in both flavors, block 32 and 128"),
        default_shape=(1024, 4096), bench_shapes=((4096, 7168), (7168, 2048), (1024, 4096)),
        make_inputs=_inputs, kernels=_kernels, options=_OPTIONS,
        arguments=lambda inputs, options, flavor: {
            "transpose_sf1s": [options["transpose_sf1"]] * options["num_weights"]}))


def batched_transpose_weight_sf(sf: Sequence[torch.Tensor], block_size: int, transpose_sf1s: Sequence[bool],
                                outs: Sequence[tuple[torch.Tensor, torch.Tensor] | None] | None = None, *,
                                target: str | None = None,
                                flavor: str | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Packed UE8M0 SF of a list of weights and of their transposes, from power-of-two block scales.

    For weight ``i`` with block scales ``sf[i]`` of shape ``(n/bs, k/bs)`` or ``(G, n/bs, k/bs)``
    (blocks of ``bs x bs`` weight elements), the exponent byte ``E = bits >> 23`` of every scale
    is packed into words of ``pf`` bytes (byte ``j`` = the ``j``-th scale of the word; 2 per
    int16 in the ``ascend`` flavor, 4 per int32 in ``cuda``): ``sf0`` packs along K and gives
    every one of the ``n`` weight rows its block row's words; ``sf1`` is the SF of the
    transposed ``(k, n)`` weight, packed along N, one row per weight column. Bytes past the last
    scale of a word are 0.

    Args:
        sf: Sequence of float32 contiguous scale tensors on one device, each ``(n/bs, k/bs)`` or
            ``(G, n/bs, k/bs)`` with ``G > 0``, ``n`` and ``k`` multiples of 128. Every scale
            must be +0 or a finite positive power of two.
        block_size: ``bs``, 32 or 128 (on every target).
        transpose_sf1s: One bool per weight: return its ``sf1`` as ``(*G, P1, k)`` instead of
            ``(*G, k, P1)`` (the same memory).
        outs: None, or one entry per weight: None (allocate) or an ``(sf0_out, sf1_out)`` pair a
            previous call returned for a weight of the same shape and options, written in place.
            A reused pair must match exactly: dtype, device, shape, strides, and a 32-byte
            aligned start.
        target: Where the op runs (see ``vmi_core.targets``); default ``$VMI_TARGET``, else the device of the
            op's leading tensor.
        flavor: Bit conventions (see ``vmi_core.targets``).

    Returns:
        ``[(sf0_out, sf1_out), ...]``, one pair per weight (``[]`` for no weights), in the flavor's
        word dtype (int16 or int32), with ``P0 = ceil((k/bs)/pf)`` and ``P1 = ceil((n/bs)/pf)``:
        ``sf0_out`` of shape ``(*G, n, P0)`` and strides ``(P0*n, 1, n)`` (stored ``[G][P0][n]``);
        ``sf1_out`` of shape ``(*G, k, P1)`` and strides ``(P1*k, 1, k)``, or with
        ``transpose_sf1`` ``(*G, P1, k)`` and strides ``(P1*k, k, 1)`` (stored ``[G][P1][k]``).
        2-D scales give 2-D outputs. Newly allocated outputs of one call are views of one flat
        pool, each weight's ``sf0`` then ``sf1``, every one starting 32-byte aligned.

    Raises:
        TypeError: ``sf`` or ``transpose_sf1s`` is not a sequence, a scale tensor is not a
            float32 tensor, an entry of ``transpose_sf1s`` is not a bool, ``block_size`` is not
            an int, or a reused output is not a tensor of the flavor's word dtype.
        ValueError: Before any kernel: the lengths of ``sf``, ``transpose_sf1s`` and ``outs``
            differ; ``block_size`` is not 32 or 128; a scale tensor is not 2-D or 3-D, not
            contiguous, on another device, has no group, its ``n`` or ``k`` is not a multiple
            of 128, or its outputs would pass the kernels' 32-bit offsets; a reused output does
            not match (shape, strides, device, alignment) or shares memory with another output or
            a scale tensor.
        ValueError: A scale is not +0 or a finite positive power of two (a sign or mantissa
            bit, a subnormal, inf or NaN): the message names the weight (``sf[i]``). Outputs
            passed in ``outs`` are left untouched.
        ValueError, TypeError: A bad ``target`` or ``flavor`` (see ``vmi_core.targets``).
    """
    _, resolved, weights, device = _prepare(sf, block_size, transpose_sf1s, target, flavor)
    if outs is None:
        outs = [None] * len(sf)
    if not isinstance(outs, (list, tuple)):
        raise TypeError(f"outs must be None or a sequence, got {type(outs).__name__}")
    if len(outs) != len(sf):
        raise ValueError(f"outs must have one entry per weight ({len(sf)}), got {len(outs)}")
    for i, pair in enumerate(outs):
        if pair is not None and (not isinstance(pair, (tuple, list)) or len(pair) != 2
                                 or not all(isinstance(t, torch.Tensor) for t in pair)):
            raise TypeError(f"outs[{i}] must be None or an (sf0_out, sf1_out) pair of tensors")
    if not sf:
        return []
    if all(pair is None for pair in outs):
        pool = BATCHED_TRANSPOSE_WEIGHT_SF(sf, block_size, transpose_sf1s, target=target, flavor=flavor)
        flat = _views(pool, weights)
    else:
        # The weights without given outputs get new ones (one pool); then all are written in place.
        fresh = [w for w, pair in zip(weights, outs, strict=True) if pair is None]
        new = iter(_views(_pool(fresh, resolved, device), fresh))
        flat = [t for pair in outs for t in (pair if pair is not None else (next(new), next(new)))]
        BATCHED_TRANSPOSE_WEIGHT_SF(sf, block_size, transpose_sf1s, out=flat, target=target, flavor=flavor)
    return [(flat[2 * i], flat[2 * i + 1]) for i in range(len(sf))]


batched_transpose_weight_sf_parallel = parallel_entry(batched_transpose_weight_sf, "sf")
