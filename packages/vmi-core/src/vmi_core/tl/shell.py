"""The portable kernel shell: the per-target pieces around a kernel body.

A kernel body is written once against a ``Shell``; the shell decides what each
piece lowers to on each target:

=====================  ==========================  =====================  ==================
piece                  ascend                      cuda                   cpu
=====================  ==========================  =====================  ==================
``kernel``             1-D core grid               grid, ``threads=``     serial grid loop
``tiles``              ``T.Persistent`` over the work-tile domain (round-robin over workers)
``tile``               UB (``alloc_shared``)       shared memory          stack array
``vector``             ``T.SimdVF``/``T.SimtVF``   no region              no region
``elementwise`` etc.   vector code (SIMD region),  ``T.Parallel``         ``T.Parallel``
                       ``T.Parallel`` (SIMT)
``copy``               MTE DMA (tails clamped)     ``T.copy``             full tiles: plain row
                                                                          loops; edges: ``T.copy``
``buffer_versions``    multi-buffering annotation  nothing                nothing
=====================  ==========================  =====================  ==================

Element-wise phases, segment and column reductions and per-row passes are written once
as functions of a lane position (``vmi_core.tl.vector``); ``elementwise``,
``segment_reduce``, ``column_reduce`` and ``rowwise`` lower them as ``T.Parallel``
loops, or as explicit 64-lane vector code inside an Ascend SIMD region (the kind of
the last ``vector`` region opened).
"""

from __future__ import annotations

import contextlib
import os

from . import vector as V
from .elementary import exp_lanes, exp_tile
from .lazy import T as TL
from .lazy import tirx

# Persistent workers per target: Ascend 950 vector cores, H200 SMs (x2 blocks), one CPU thread.
DEFAULT_WORKERS = {"ascend": 64, "cuda": 264, "cpu": 1}
WORKERS_ENV = "VMI_{}_WORKERS"
CUDA_THREADS = 128
SIMT_THREADS = 128

SIMD = "simd"
SIMT = "simt"


def _language(target: str):
    if target == "ascend":
        import tilelang.ascend  # noqa: F401  (registers the backend)
        import tilelang.ascend.language as TA

        return TA
    return TL


class Shell:
    """Target-specific launch, buffers, vector regions and DMA for one kernel body."""

    def __init__(self, target: str, workers: int | None = None):
        if target not in DEFAULT_WORKERS:
            raise ValueError(f"target must be one of {tuple(DEFAULT_WORKERS)}, got {target!r}")
        self.target = target
        self.T = _language(target)
        env = os.environ.get(WORKERS_ENV.format(target.upper()))
        self.workers = int(workers or env or DEFAULT_WORKERS[target])
        self.is_cpu = target == "cpu"
        self.is_cuda = target == "cuda"
        self.is_ascend = target == "ascend"
        # A cpu ``copy`` into a tile fills the part past the buffer's edge with zeros (Ascend DMA
        # leaves it as it was): a body may rely on it to skip masking those elements.
        self.edges_read_as_zero = self.is_cpu
        self.in_simd = False

    def kernel(self, grid):
        """The launch: a 1-D grid of ``grid`` blocks (cores on Ascend)."""
        if self.is_cuda:
            return self.T.Kernel(grid, threads=CUDA_THREADS)
        return self.T.Kernel(grid)

    def persistent_kernel(self):
        """A launch of ``self.workers`` persistent workers; pair with ``tiles``."""
        return self.kernel(self.workers)

    def tiles(self, domain, worker, *, group_size=1, num_stages=2):
        """Persistent loop over the work-tile ``domain`` for ``worker``.

        Tiles go round-robin over the workers in waves; ``group_size`` consecutive
        tiles of the last axis stay on consecutive iterations of one worker, and
        ``num_stages`` > 1 lets DMA of the next tile overlap compute (Ascend).
        """
        return self.T.Persistent(list(domain), self.workers, worker, group_size=group_size,
                                 num_stages=num_stages if self.is_ascend else 0)

    def tile(self, shape, dtype):
        """An on-chip tile (UB on Ascend, shared memory on CUDA, a stack array on CPU).

        On CUDA every tile is a slice of the one dynamic shared-memory buffer, which TileLang places
        at 1024-byte aligned offsets: a tile copied to global memory by a TMA store from a swizzled
        layout must be, and static ``__shared__`` arrays are packed wherever ptxas puts them (the
        H200's wrong scales and misaligned-address faults). Dynamic memory also lifts the 48 KB
        static limit of some architectures (the launch opts in to the kernel's size).
        """
        if self.is_ascend:
            return self.T.alloc_shared(shape, dtype)
        return self.T.alloc_shared(shape, dtype, scope="shared.dyn" if self.is_cuda else "shared")

    def vector(self, kind: str = SIMT):
        """The vector region a body runs in; ``kind`` is ``"simd"`` or ``"simt"`` on Ascend.

        A SIMD region holds the explicit vector code of ``elementwise``, ``segment_reduce``,
        ``column_reduce`` and ``rowwise`` (their kernels lower with ``simd_parallel=False``);
        hand-written ``T.Parallel`` loops belong in SIMT regions, since TileLang 0.1.15's SIMD
        lowering of ``T.Parallel`` accepts only plain arithmetic on one dtype.
        """
        if kind not in (SIMD, SIMT):
            raise ValueError(f"vector region kind must be 'simd' or 'simt', got {kind!r}")
        self.in_simd = self.is_ascend and kind == SIMD
        if not self.is_ascend:
            return contextlib.nullcontext()
        if kind == SIMD:
            return self.T.SimdVF()
        return self.T.SimtVF(threads=SIMT_THREADS)

    def group_tile(self, rows: int, groups: int, dtype):
        """A per-(row, group) tile for ``at.group`` and ``segment_reduce`` (padded for vector code
        on Ascend; call it where the phases' ``vector`` region kind is known)."""
        return self.tile(V.group_tile_shape(self.is_ascend, rows, groups), dtype)

    def lane_table(self, n: int, dtype):
        """A 1-D tile of ``n`` group values for ``at.group`` (padded for vector code on Ascend)."""
        return self.tile((V.lane_table_length(self.is_ascend, n),), dtype)

    def group_domain(self, rows: int, groups: int):
        """The element-wise domain over a ``group_tile`` (padding included in vector code)."""
        rows_, cols = V.group_tile_shape(self.in_simd, rows, groups)
        return (rows, cols)

    def elementwise(self, shape, value, outs, *, pack_e2m1: bool = False, fp4_tiles=()):
        """``outs[k][i, j] = value(at)[k]`` over ``shape`` (``vmi_core.tl.vector.elementwise``)."""
        return V.elementwise(self.in_simd, shape, value, outs, pack_e2m1=pack_e2m1, fp4_tiles=fp4_tiles)

    def rowwise(self, rows: int, body, valid=None):
        """``body(at)`` per tile row, one lane per row, rows from ``valid`` on skipped where that saves
        work (``vmi_core.tl.vector.rowwise``)."""
        return V.rowwise(self.in_simd, rows, body, valid)

    def column_reduce(self, acc, src, shape, op: str, init):
        """``acc[0, c]`` = ``op`` over the rows of ``src`` (``vmi_core.tl.vector.column_reduce``)."""
        return V.column_reduce(self.in_simd, acc, src, shape, op, init)

    def accumulate_rows(self, parts, total, num_rows, width: int):
        """``total[j] +=`` the first ``num_rows`` rows of ``parts`` in row order
        (``vmi_core.tl.vector.accumulate_rows``)."""
        return V.accumulate_rows(self.in_simd, parts, total, num_rows, width)

    def segment_reduce(self, acc, shape, seg_len: int, value, op: str, init):
        """``acc[i, s]`` = ``op`` over each ``seg_len`` columns (``vmi_core.tl.vector.segment_reduce``)."""
        return V.segment_reduce(self.in_simd, acc, shape, seg_len, value, op, init)

    def row_sum(self, acc, shape, term, *, fused: bool = False):
        """``acc[i]`` = the fixed-order fp32 sum of ``term`` over row ``i`` of ``shape``
        (``vmi_core.tl.vector.row_sum``; the torch twins are ``vmi_core.sums``). Outside a SIMD
        region it allocates its ``(rows, LANES)`` tile of partial sums, so on Ascend call it in a
        SIMD region."""
        partials = None if self.in_simd else self.tile((shape[0], V.LANES), "float32")
        return V.row_sum(self.in_simd, acc, partials, shape, term, fused)

    def copy(self, src, dst):
        """DMA between global memory and a tile; partial tiles at the edges are clamped.

        On cpu, ``T.copy`` checks both bounds of every element (and TileLang's memory-safety pass
        checks them again), which keeps its loops scalar: a tile that lies wholly inside the
        buffer is copied through a view of exactly the tile's extent instead, whose accesses need
        no checks, and only edge tiles take ``T.copy``.
        """
        if self.is_cpu:
            view = _tile_view(src, dst)
            if view is not None:
                to_tile = isinstance(src, tirx.BufferLoad)
                return _full_or_edge_copy(*view, dst if to_tile else src, src, dst, to_tile)
        return self.T.copy(src, dst)

    def elementwise_stream(self, sources, value, outputs):
        """An element-wise phase between global buffers: ``sources`` are ``(position, tile)`` pairs
        copied into their tiles, ``outputs`` ``(tile, position)`` pairs copied out of theirs, and
        ``value(*source_tiles, at)`` gives one lane value per output (a tuple for several), computed
        over the first output tile's shape (in a SIMD region on Ascend).

        On cpu a tile wholly inside every buffer skips the tiles: ``value`` reads the sources'
        windows and writes the outputs', one pass over the data as torch's element-wise ops make
        (through the tiles, more passes copy what is used once); edge tiles take the tiles.
        """
        tiles = [tile for _, tile in sources]
        outs = [tile for tile, _ in outputs]
        shape = outs[0].shape
        if self.is_cpu:
            views = [_tile_view(at, tile) for at, tile in sources] + [_tile_view(tile, at) for tile, at in outputs]
            if all(view is not None for view in views):
                return _stream_or_tiles(tirx.all(*[view[0] for view in views]), [view[1] for view in views],
                                        [view[2] for view in views], sources, value, outputs, shape)
        return _through_tiles(self, sources, value, outputs, shape, tiles, outs)

    def exp(self, shape, src, dst):
        """``dst = e^src`` over a ``(rows, cols)`` tile domain, correctly rounded, as a phase of its
        own (outside vector regions; ``src`` and ``dst`` distinct). On cpu two vectorized passes
        (``vmi_core.tl.elementary.exp_tile``: the fast evaluation, then the exact one only in a tile
        where the fast one left a lane undecided); on cuda and Ascend (a SIMT region) one ``exp``
        per lane, whose rare undecided lanes branch to the exact evaluation."""
        if self.is_cpu:
            exp_tile(shape, src, dst)
            return
        with self.vector(SIMT):
            exp_lanes(shape, src, dst)

    def buffer_versions(self, versions: dict):
        """Multi-buffer ``{tile: count}`` on targets that pipeline DMA (Ascend)."""
        if self.is_ascend:
            self.T.annotate_buffer_versions(versions)


def _tile_view(src, dst):
    """``(inside, offset, window)`` for a copy between a global buffer position and a 1-D or 2-D
    tile of its rank, or of its last dimensions (the leading indices pick one element each):
    whether the tile lies wholly inside the buffer, the element offset of its first element, and a
    function giving the buffer's window of the tile's shape at an offset. None for any other copy."""
    to_tile = isinstance(src, tirx.BufferLoad)
    at, tile = (src, dst) if to_tile else (dst, src)
    if not isinstance(at, tirx.BufferLoad) or not isinstance(tile, tirx.Buffer):
        return None
    buffer = at.buffer
    lead = len(at.indices) - len(tile.shape)
    if buffer.scope() != "global" or lead < 0 or len(tile.shape) > 2:
        return None
    strides = list(buffer.strides)
    if not strides:  # compact: row-major strides of the shape
        strides = [1]
        for extent in reversed(list(buffer.shape)[1:]):
            strides.insert(0, strides[0] * extent)
    extents = [1] * lead + list(tile.shape)
    inside = tirx.all(*[bound for index, extent, size in zip(at.indices, extents, buffer.shape, strict=True)
                        for bound in (index >= 0, index + extent <= size)])
    offset = buffer.elem_offset + sum(index * stride for index, stride in zip(at.indices, strides, strict=True))

    def window(base):
        return tirx.decl_buffer(tile.shape, buffer.dtype, name=f"{buffer.name}_window", data=buffer.data,
                                strides=strides[lead:], elem_offset=base)

    return inside, offset, window


# In the two macros below, the loops go over Python lists by index: TileLang's builder names a
# buffer after a variable it is bound to, and makes a bound expression a let binding.

@TL.macro
def _through_tiles(shell, sources, value, outputs, shape, tiles, outs):
    for k in _indices(sources):
        shell.copy(sources[k][0], sources[k][1])
    with shell.vector(SIMD):
        shell.elementwise(shape, lambda at: value(*tiles, at), outs)
    for k in _indices(outputs):
        shell.copy(outputs[k][0], outputs[k][1])


@TL.macro
def _stream_or_tiles(inside, offsets, windows, sources, value, outputs, shape):
    # The windows' offsets are scalars of their own, as in _full_or_edge_copy.
    if inside:
        bases = TL.alloc_local((len(offsets),), "int64")
        for k in _indices(offsets):
            bases[k] = offsets[k]
        sources_at = [windows[k](bases[k]) for k in _indices(sources)]
        outputs_at = [windows[len(sources) + k](bases[len(sources) + k]) for k in _indices(outputs)]
        if len(shape) == 1:
            V.elementwise(False, shape, lambda at: value(*sources_at, at), outputs_at)
        else:
            V.elementwise_by_row(shape[0], shape[1], lambda at: value(*sources_at, at), outputs_at)
    else:
        for k in _indices(sources):
            TL.copy(sources[k][0], sources[k][1])
        V.elementwise(False, shape, lambda at: value(*[pair[1] for pair in sources], at),
                      [pair[0] for pair in outputs])
        for k in _indices(outputs):
            TL.copy(outputs[k][0], outputs[k][1])


def _indices(items) -> list[int]:
    return list(range(len(items)))


@TL.macro
def _full_or_edge_copy(inside, offset, window_at, tile, src, dst, to_tile):
    # The window's offset is a scalar of its own: TileLang rewrites the loop variables a tile
    # position is made of (and inlines let bindings) after this body is built, which a
    # buffer's offset would not follow. (The window is not bound to a name here either: the
    # builder would rename the buffer's data, the kernel's parameter.)
    if inside:
        base = TL.alloc_var(getattr(offset, "dtype", "int32"))  # a constant offset arrives as an int
        base = offset
        if len(tile.shape) == 1:
            for j in TL.serial(tile.shape[0]):
                if to_tile:
                    tile[j] = window_at(base)[j]
                else:
                    window_at(base)[j] = tile[j]
        else:
            for i, j in TL.grid(tile.shape[0], tile.shape[1]):
                if to_tile:
                    tile[i, j] = window_at(base)[i, j]
                else:
                    window_at(base)[i, j] = tile[i, j]
    else:
        TL.copy(src, dst)
