"""Element-wise and segment-reduction phases over tiles, written once for both lane kinds.

A phase is a Python function of a *lane position* ``at`` that reads tiles through it
(``at.load``, ``at.group``, ``at.column``) and returns lane values (``vmi_core.tl.simd``). The
shell runs it either

* as a ``T.Parallel`` loop, ``at`` one element ``(i, j)`` (cpu, cuda, Ascend SIMT regions), or
* as explicit vector code in an Ascend SIMD region, ``at`` 64 consecutive elements of a tile row
  in one register: loads widen narrow data into 32-bit lanes (``UNPK_B16``, ``UNPK4_B8``),
  stores narrow it again (``PK_B32``, ``PK4_B32``), per-group values are gathered into their
  lanes (``vselr``), and segment reductions are masked whole-register reductions (``vcmax``)
  whose lane 0 is stored (``ONEPT_B32``).

Lanes past a tile's valid columns hold stale data in both forms; phases mask them through
``at.column()`` before they reach a reduction, and the DMA drops them on the way out.
"""

from __future__ import annotations

from . import formats as F
from .lazy import T
from .reduce import combine
from .simd import LANES, LaneVar, Pred, Vec, bitcast, fma, keep, maximum, minimum, simd

_LOAD_DIST = {"uint16": ("UNPK_B16", 0xFFFF), "uint8": ("UNPK4_B8", 0xFF)}
_STORE_DIST = {"uint16": "PK_B32", "uint8": "PK4_B32"}
_WIDE = ("float32", "uint32", "int32")


def group_tile_shape(vector: bool, rows: int, groups: int) -> tuple[int, int]:
    """Shape of a per-(row, group) tile that ``at.group`` reads and ``segment_reduce`` fills.

    The vector form reads ``LANES`` values from any 32-byte boundary of a row (``at.group``
    starts at the chunk's first group rounded down to 8) and stores scales in whole registers:
    rows are padded to 32-byte multiples, and rows are added so that a read from the last 32
    bytes of the last row stays inside the tile.
    """
    if not vector:
        return rows, groups
    padded = -(-groups // 8) * 8
    return rows + -(-(LANES - 8) // padded), padded


def lane_table_length(vector: bool, n: int) -> int:
    """Length of a 1-D tile of ``n`` group values that ``at.group`` reads (padded in vector code)."""
    return n + LANES if vector else n


def deinterleave(a: Vec, b: Vec) -> tuple[Vec, Vec]:
    """The even and the odd lanes of the 128 lanes ``a, b``, each in order in one register."""
    even, odd = simd().vdintlv(a.expr, b.expr)
    return keep(Vec(even)), keep(Vec(odd))


def interleave(a: Vec, b: Vec) -> tuple[Vec, Vec]:
    """``a[0], b[0], a[1], b[1], ...``: the first 64 of the 128 lanes, then the last 64."""
    low, high = simd().vintlv(a.expr, b.expr)
    return keep(Vec(low)), keep(Vec(high))


def _flat(tile, index: int):
    """The element of a row-major 2-D ``tile`` at flat position ``index``."""
    cols = tile.shape[1]
    return tile[index // cols, index % cols]


class ElementAt:
    """One element of a ``T.Parallel`` iteration: ``head`` (the leading indices) and column ``j``."""

    vector = False

    def __init__(self, head: tuple, j):
        self.head, self.j = head, j

    @property
    def i(self):
        return self.head[0]

    def load(self, tile):
        return tile[(*self.head, self.j)]

    def group(self, tile, size: int, row=None):
        """``tile[..., j // size]``: the value of the element's group (in row ``row`` of a 2-D
        ``tile`` when given, else in the element's own row)."""
        head = self.head if row is None else (row,)
        return tile[(*head, self.j // size)]

    def column(self):
        return self.j


class ChunkAt:
    """``LANES`` consecutive elements ``(*head, col0 + lane)`` of a tile row, in one register."""

    vector = True

    def __init__(self, head: tuple, col0, codes: dict | None = None):
        self.head, self.col0 = head, col0
        # FP4 tiles, unpacked by the caller: tile -> this chunk's E2M1 codes.
        self.codes = codes or {}

    def load(self, tile):
        return load(tile[(*self.head, self.col0)])

    def group(self, tile, size: int, row=None):
        """``tile[..., (col0 + lane) // size]`` per lane (``size`` a power of two): the register of
        group values from the chunk's first group (rounded down to 32 bytes) on, gathered into the
        lanes of their groups. Tiles read this way hold one register past their last group
        (``group_tile_shape``, ``lane_table_length``)."""
        head = self.head if row is None else (row,)
        shift = int(size).bit_length() - 1
        base = (self.col0 >> shift) // 8 * 8
        groups = load(tile[(*head, base)])
        return gather(groups, bitcast((self.column() >> shift) - base, "uint32"))

    def column(self):
        return Vec.lane_index(self.col0)


class RowAt:
    """One row ``i`` of a ``T.Parallel`` loop over rows (one lane per row)."""

    vector = False

    def __init__(self, i):
        self.i = i

    def load(self, tile, col):
        return tile[self.i, col]

    def store(self, tile, col, value):
        T.buffer_store(tile, value, [self.i, col])

    def store_row_value(self, tile, value):
        """``tile[i] = value`` for a 1-D tile of per-row values."""
        T.buffer_store(tile, value, [self.i])


class RowsAt:
    """``LANES`` consecutive rows ``row0 + lane`` of 2-D tiles, one row per lane: columns are read
    and written by UB gathers and scatters (``row stride x lane`` offsets). With fewer rows than
    lanes, ``mask`` keeps the lanes past them out of every access."""

    vector = True

    def __init__(self, row0, mask: Pred | None = None):
        self.row0, self.mask = row0, mask

    def _offsets(self, tile, col):
        # Gathers and scatters take a 32-byte aligned base: the row block's start, the column in
        # the per-lane element offsets.
        return bitcast(Vec.lane_index(0) * int(tile.shape[1]) + col, "uint32")

    def _mask(self):
        return None if self.mask is None else self.mask.expr

    def load(self, tile, col):
        return Vec(simd().vgather2(tile[self.row0, 0], self._offsets(tile, col).expr, self._mask()))

    def store(self, tile, col, value):
        value = value if isinstance(value, Vec) else Vec.splat(value, str(tile.dtype))
        T.evaluate(simd().vscatter(bitcast(value, str(tile.dtype)).expr, tile[self.row0, 0],
                                   self._offsets(tile, col).expr, self._mask()))

    def store_row_value(self, tile, value: Vec):
        T.evaluate(simd().vsts(tile[self.row0], bitcast(value, str(tile.dtype)).expr, self._mask(),
                               dist="NORM_B32"))


def decode(fmt: str, at, tile):
    """The element(s) at ``at`` of an input tile in ``fmt`` (``fp32``, ``bf16``, ``e4m3`` or
    ``e2m1``; narrow formats as integer bit views, FP4 two codes per byte) as fp32."""
    if fmt == "e2m1":
        if not at.vector:
            return F.e2m1_to_f32(F.e2m1_unpack(tile[at.i, at.j // 2], at.j % 2))
        if tile not in at.codes:
            raise ValueError("an FP4 tile read by vector code must be passed to elementwise as fp4_tiles")
        return F.e2m1_to_f32(at.codes[tile])
    raw = at.load(tile)
    if fmt == "bf16":
        return F.bf16_to_f32(raw)
    if fmt == "e4m3":
        return F.e4m3_to_f32(raw)
    return raw


def load(ref) -> Vec:
    """The ``LANES`` elements from ``ref`` (a tile element) on, in 32-bit lanes (narrow integers
    zero-extended)."""
    S = simd()
    dtype = str(ref.buffer.dtype)
    if dtype in _WIDE:
        return Vec(S.vld(ref))
    dist, width_mask = _LOAD_DIST[dtype]
    return bitcast(Vec(S.vld(ref, dist=dist)), "uint32") & width_mask


def store(ref, value: Vec):
    """Store ``LANES`` lanes at ``ref`` (a tile element); narrow tiles keep each lane's low bits."""
    S = simd()
    dtype = str(ref.buffer.dtype)
    if dtype in _WIDE:
        return S.vsts(ref, bitcast(value, dtype).expr, dist="NORM_B32")
    return S.vsts(ref, bitcast(value, "uint32").expr, dist=_STORE_DIST[dtype])


def gather(src: Vec, index: Vec) -> Vec:
    """``src[index[lane]]`` per lane (indices of uint32 lanes, below ``LANES``)."""
    return Vec(simd().vselr(src.expr, index.expr))


def _store_lane0(ref, value: Vec):
    return simd().vsts(ref, value.expr, dist="ONEPT_B32")


def segment_masks(seg_len: int) -> list[Pred]:
    """Predicates selecting each ``seg_len``-lane segment of a register, bound once."""
    lane = Vec.lane_index(0)
    return [keep((lane > s * seg_len - 1) & (lane < (s + 1) * seg_len)) for s in range(LANES // seg_len)]


def _reduce_register(op: str, value: Vec, mask: Pred) -> Vec:
    S = simd()
    if op == "max":
        return Vec(S.vcmax(value.expr, mask.expr))
    return Vec(S.vcmin(value.expr, mask.expr))


@T.macro
def _elementwise_scalar(rows: int, cols: int, value, outs, pack_e2m1: bool):
    if pack_e2m1:
        for i, jb in T.Parallel(rows, cols // 2):
            outs[0][i, jb] = F.e2m1_pack(value(ElementAt((i,), 2 * jb)), value(ElementAt((i,), 2 * jb + 1)))
    else:
        for i, j in T.Parallel(rows, cols):
            _store_elements(outs, value(ElementAt((i,), j)), (i, j))


@T.macro
def elementwise_by_row(rows: int, cols: int, value, outs):
    """``outs[k][i, j] = value(at)[k]`` row by row: for windows of global buffers, whose rows lie a
    runtime stride apart, each row's columns are one contiguous loop that vectorizes (a loop over
    both dimensions is fused and is not)."""
    for i in T.serial(rows):
        for j in T.Parallel(cols):
            _store_elements(outs, value(ElementAt((i,), j)), (i, j))


@T.macro
def _elementwise_scalar_1d(cols: int, value, outs):
    for j in T.Parallel(cols):
        _store_elements(outs, value(ElementAt((), j)), (j,))


def _store_elements(outs, values, index):
    for out, v in zip(outs, _as_tuple(values), strict=True):
        T.buffer_store(out, v, list(index))


@T.macro
def _elementwise_rows(rows: int, cols: int, value, outs, pack_e2m1: bool, fp4_tiles: tuple, paired: bool):
    if paired:
        # Two registers (128 elements, 64 bytes of FP4) at a time.
        for r in T.serial(rows):
            for c in T.serial(cols // (2 * LANES)):
                _pair_of_chunks(outs, value, r, c * 2 * LANES, pack_e2m1, fp4_tiles)
    else:
        for r in T.serial(rows):
            for c in T.serial(cols // LANES):
                _store_chunk(outs, value(ChunkAt((r,), c * LANES)), (r, c * LANES))


def _pair_of_chunks(outs, value, r, col0, pack_e2m1: bool, fp4_tiles: tuple):
    low_codes, high_codes = {}, {}
    for tile in fp4_tiles:
        packed = keep(load(tile[r, col0 // 2]))
        # Element 2k is the low nibble of byte k: interleaving the nibbles restores element order.
        low_codes[tile], high_codes[tile] = interleave(packed & 0xF, packed >> 4)
    low = value(ChunkAt((r,), col0, low_codes))
    high = value(ChunkAt((r,), col0 + LANES, high_codes))
    if pack_e2m1:
        # Even and odd elements of the 128 -> one byte per pair.
        even, odd = deinterleave(low, high)
        T.evaluate(store(outs[0][r, col0 // 2], F.e2m1_pack(even, odd)))
    else:
        _store_chunk(outs, low, (r, col0))
        _store_chunk(outs, high, (r, col0 + LANES))


@T.macro
def _elementwise_chunks_1d(cols: int, value, outs):
    for c in T.serial(cols // LANES):
        _store_chunk(outs, value(ChunkAt((), c * LANES)), (c * LANES,))


@T.macro
def _elementwise_flat(rows: int, cols: int, value, outs):
    # Small rows (fewer than LANES columns): 64 elements of the row-major tile at a time; the
    # tiles hold whole registers (``group_tile_shape``).
    for k in T.serial((rows * cols + LANES - 1) // LANES):
        _store_flat(outs, value(ChunkAt((k * LANES // cols,), k * LANES % cols)), k * LANES)


def _as_tuple(values):
    return values if isinstance(values, tuple) else (values,)


def _store_chunk(outs, values, index):
    for out, v in zip(outs, _as_tuple(values), strict=True):
        T.evaluate(store(out[index], v))


def _store_flat(outs, values, index):
    for out, v in zip(outs, _as_tuple(values), strict=True):
        T.evaluate(store(_flat(out, index), v))


def elementwise(vector: bool, shape, value, outs, *, pack_e2m1: bool = False, fp4_tiles=()):
    """``outs[k][i, j] = value(at)[k]`` over a ``(rows, cols)`` or ``(cols,)`` tile domain.

    ``value`` returns one lane value per output (a tuple for several). ``pack_e2m1``: one
    output of E2M1 codes, two per byte (``cols`` logical elements, ``cols // 2`` bytes; 2-D).
    ``fp4_tiles``: input tiles of packed FP4 bytes that ``value`` decodes (``decode("e2m1", ...)``);
    the vector form unpacks them once per 128 elements.
    The vector form needs ``cols`` a multiple of ``LANES`` (``2 * LANES`` when packing), or
    ``cols`` dividing ``LANES`` (whole-tile chunks over tiles padded to whole registers, such
    as ``group_tile_shape``'s; ``at.group`` and ``at.column`` unavailable).
    """
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    if len(shape) == 1:
        (cols,) = shape
        if not vector:
            _elementwise_scalar_1d(cols, value, outs)
            return
        if pack_e2m1 or cols % LANES:
            raise ValueError(f"no vector form for a {cols}-element phase (pack_e2m1={pack_e2m1})")
        _elementwise_chunks_1d(cols, value, outs)
        phase_barrier()
        return
    rows, cols = shape
    if not vector:
        _elementwise_scalar(rows, cols, value, outs, pack_e2m1)
    elif (pack_e2m1 or fp4_tiles) and cols % (2 * LANES) == 0:
        _elementwise_rows(rows, cols, value, outs, pack_e2m1, tuple(fp4_tiles), True)
    elif not (pack_e2m1 or fp4_tiles) and cols % LANES == 0:
        _elementwise_rows(rows, cols, value, outs, False, (), False)
    elif not (pack_e2m1 or fp4_tiles) and LANES % cols == 0:
        _elementwise_flat(rows, cols, value, outs)
    else:
        raise ValueError(f"no vector form for a {rows}x{cols} element-wise phase "
                         f"(pack_e2m1={pack_e2m1}, {len(fp4_tiles)} FP4 tiles)")
    if vector:
        phase_barrier()


def phase_barrier():
    # Vector loads and stores are separate pipelines within a SIMD region, ordered only through
    # shared registers: the next phase's loads (and stores) wait for this phase's accesses.
    T.evaluate(simd().mem_bar("VV_ALL"))


@T.macro
def _segment_reduce_scalar(acc, rows: int, segments: int, seg_len: int, value, op: str, init):
    # The running value stays in a per-lane scalar and ``acc`` is stored once: a read-modify-write
    # of the tile in the loop would make TileLang put a barrier inside the loop, which lanes past
    # the last ``(i, s)`` never reach.
    for i, s in T.Parallel(rows, segments):
        running = T.alloc_var(acc.dtype)
        running = init
        for j in T.serial(seg_len):
            running = combine(op, running, value(ElementAt((i,), s * seg_len + j)))
        acc[i, s] = running


@T.macro
def _segment_reduce_short(acc, rows: int, segments: int, seg_len: int, value, op: str, masks):
    # Segments of at most one register: one masked reduction per segment.
    for r in T.serial(rows):
        for c in T.serial(segments * seg_len // LANES):
            _reduce_chunk(acc, r, c, seg_len, value(ChunkAt((r,), c * LANES)), op, masks)


def _reduce_chunk(acc, r, c, seg_len, v, op, masks):
    v = keep(v)
    per_register = LANES // seg_len
    for s, mask in enumerate(masks):
        T.evaluate(_store_lane0(acc[r, c * per_register + s], _reduce_register(op, v, mask)))


@T.macro
def _segment_reduce_long(acc, rows: int, segments: int, seg_len: int, value, op: str, everything):
    # Segments of several registers: combine them lane-wise, then reduce one register.
    for r in T.serial(rows):
        for s in T.serial(segments):
            _reduce_long_segment(acc, r, s, seg_len, value, op, everything)


def _reduce_long_segment(acc, r, s, seg_len, value, op, everything):
    running = value(ChunkAt((r,), s * seg_len))
    for k in range(1, seg_len // LANES):
        running = _combine_registers(op, running, value(ChunkAt((r,), s * seg_len + k * LANES)))
    T.evaluate(_store_lane0(acc[r, s], _reduce_register(op, running, everything)))


def segment_reduce(vector: bool, acc, shape, seg_len: int, value, op: str, init):
    """``acc[i, s] = op over j < seg_len of value(at(i, s * seg_len + j))`` over a ``(rows, cols)``
    domain. ``op`` is ``max``, ``min`` or ``sum``; the vector form does ``max``/``min`` of integer
    lanes (order-free), and ``seg_len`` dividing ``LANES`` or a multiple of it."""
    rows, cols = shape
    segments = cols // seg_len
    if not vector:
        return _segment_reduce_scalar(acc, rows, segments, seg_len, value, op, init)
    if op not in ("max", "min"):
        raise ValueError(f"the vector segment reduction does {op!r} only in a fixed order; use max or min")
    if LANES % seg_len == 0:
        _segment_reduce_short(acc, rows, segments, seg_len, value, op, segment_masks(seg_len))
    elif seg_len % LANES == 0:
        _segment_reduce_long(acc, rows, segments, seg_len, value, op, segment_masks(LANES)[0])
    else:
        raise ValueError(f"no vector form for segments of {seg_len} lanes")
    phase_barrier()


# --- fixed-order fp32 row sums (the lane order of vmi_core.sums) -----------------------------

def _accumulate(partial, term, at, fused: bool):
    if fused:
        a, b = term(at)
        return fma(a, b, partial)
    return partial + term(at)


@T.macro
def _row_sum_scalar(acc, partials, rows: int, chunks: int, term, fused: bool):
    # Lane l of a row accumulates columns l, l + 64, ... in a per-lane scalar (stored once, as in
    # _segment_reduce_scalar); then one lane per row folds the row's partials in a local array
    # (in place: p[l] reads p[2l] and p[2l + 1], both at or after l, before anything overwrites
    # them; local, so that no shared tile is read and written inside a thread-guarded branch).
    for i, lane in T.Parallel(rows, LANES):
        running = T.alloc_var("float32")
        running = T.float32(0)
        for k in T.serial(chunks):
            running = _accumulate(running, term, ElementAt((i,), k * LANES + lane), fused)
        partials[i, lane] = running
    for i in T.Parallel(rows):
        folded = T.alloc_local((LANES,), "float32")
        for lane in T.serial(LANES):
            folded[lane] = partials[i, lane]
        for width in (32, 16, 8, 4, 2, 1):
            for lane in T.serial(width):
                folded[lane] = folded[2 * lane] + folded[2 * lane + 1]
        acc[i] = folded[0]


def _row_sum_register(acc, r, chunks: int, term, fused: bool):
    running = LaneVar(True, "float32", 0.0)
    with T.serial(chunks) as k:
        running.set(_accumulate(running.get(), term, ChunkAt((r,), k * LANES), fused))
    partials = running.get()
    for _ in range(6):
        even, odd = deinterleave(partials, partials)
        partials = keep(even + odd)
    T.evaluate(_store_lane0(acc[r], partials))


@T.macro
def _row_sum_vector(acc, rows: int, chunks: int, term, fused: bool):
    for r in T.serial(rows):
        _row_sum_register(acc, r, chunks, term, fused)


def row_sum(vector: bool, acc, partials, shape, term, fused: bool = False):
    """``acc[i]`` = the sum over ``j < cols`` of ``term(at(i, j))`` in the lane order of
    ``vmi_core.sums`` (64 partials over columns ``l, l + 64, ...`` from +0.0, then six folds of
    adjacent partials), over a ``(rows, cols)`` domain with ``cols`` a multiple of ``LANES``.

    ``term`` returns an fp32 lane value, or with ``fused`` a pair ``(a, b)`` that is accumulated
    as ``fma(a, b, partial)``. The scalar form keeps the partials in ``partials``, a
    ``(rows, LANES)`` fp32 tile; the vector form keeps a row's partials in one register and folds
    them by deinterleaving (``partials`` unused)."""
    rows, cols = shape
    if cols % LANES:
        raise ValueError(f"row_sum needs a multiple of {LANES} columns, got {cols}")
    if not vector:
        return _row_sum_scalar(acc, partials, rows, cols // LANES, term, fused)
    _row_sum_vector(acc, rows, cols // LANES, term, fused)
    phase_barrier()


@T.macro
def _accumulate_rows_scalar(parts, total, num_rows, width: int):
    for j in T.Parallel(width):
        running = T.alloc_var("float32")
        running = total[j]
        for p in T.serial(num_rows):
            running = running + parts[p, j]
        total[j] = running


@T.macro
def _accumulate_rows_vector(parts, total, num_rows, width: int):
    for c in range(width // LANES):
        running = LaneVar(True, "float32", ChunkAt((), c * LANES).load(total))
        for p in T.serial(num_rows):
            running.set(running.get() + ChunkAt((p,), c * LANES).load(parts))
        T.evaluate(store(total[c * LANES], running.get()))


def accumulate_rows(vector: bool, parts, total, num_rows, width: int):
    """``total[j] += parts[0, j] + parts[1, j] + ...`` over the first ``num_rows`` rows (a runtime
    value), one fp32 rounding per addition in row order: the ordered reduction of per-block
    partial rows, whose bits then depend on the block count only. The vector form adds whole
    registers (``width`` a multiple of ``LANES``), the scalar form one lane per column."""
    if not vector:
        return _accumulate_rows_scalar(parts, total, num_rows, width)
    if width % LANES:
        raise ValueError(f"accumulate_rows needs a multiple of {LANES} columns in vector code, got {width}")
    _accumulate_rows_vector(parts, total, num_rows, width)
    phase_barrier()


@T.macro
def _column_reduce_scalar(acc, src, rows: int, cols: int, op: str, init):
    for c in T.Parallel(cols):
        # A per-lane register, not a tile: with fewer lanes than threads, a tile written inside
        # the serial loop would need a barrier in a branch only some threads take (CUDA, SIMT).
        running = T.alloc_var(acc.dtype)
        running = init
        for r in T.serial(rows):
            running = combine(op, running, src[r, c])
        acc[0, c] = running


def _column_reduce_vector(acc, src, rows: int, op: str):
    running = simd().alloc_var(acc.dtype)
    T.buffer_store(running, load(src[0, 0]).expr, [0])
    with T.serial(1, rows) as r:
        T.buffer_store(running, _combine_registers(op, Vec(running[0]), load(src[r, 0])).expr, [0])
    T.evaluate(store(acc[0, 0], Vec(running[0])))


def _combine_registers(op: str, a: Vec, b: Vec) -> Vec:
    return maximum(a, b) if op == "max" else minimum(a, b)


def column_reduce(vector: bool, acc, src, shape, op: str, init):
    """``acc[0, c] = op over r < rows of src[r, c]`` for the ``(rows, cols)`` domain of ``src``
    (``max`` or ``min``; the vector form reduces whole rows of a ``group_tile`` of at most
    ``LANES`` columns, lanes past ``cols`` included)."""
    rows, cols = shape
    if not vector:
        return _column_reduce_scalar(acc, src, rows, cols, op, init)
    if op not in ("max", "min") or cols > LANES:
        raise ValueError(f"no vector form for a {op!r} over the rows of {cols} columns")
    _column_reduce_vector(acc, src, rows, op)
    phase_barrier()


@T.macro
def _rowwise_scalar(rows: int, body):
    for i in T.Parallel(rows):
        body(RowAt(i))


@T.macro
def _rowwise_scalar_until(rows: int, valid, body):
    for i in T.Parallel(rows):
        if i < valid:
            body(RowAt(i))


@T.macro
def _rowwise_vector(rows: int, body):
    for c in T.serial(rows // LANES):
        body(RowsAt(c * LANES))


def rowwise(vector: bool, rows: int, body, valid=None):
    """``body(at)`` for every row of a tile, one lane per row; ``body`` reads and writes through
    ``at`` (``load``/``store`` of a column, ``store_row_value``). The vector form takes
    ``rows`` a multiple of ``LANES``, or fewer (the lanes past them masked), and tiles whose rows
    are 32-byte multiples. ``valid`` (a runtime row count): rows from it on are skipped where a row
    is a loop iteration (a decode-size call computes its tokens, not the whole tile); vector lanes
    compute them all, so their results must not be used."""
    if not vector:
        return _rowwise_scalar(rows, body) if valid is None else _rowwise_scalar_until(rows, valid, body)
    if rows < LANES:
        body(RowsAt(0, keep(Vec.lane_index(0) < rows)))
    elif rows % LANES == 0:
        _rowwise_vector(rows, body)
    else:
        raise ValueError(f"no vector form for {rows} rows (fewer than {LANES}, or a multiple)")
    phase_barrier()
