"""Kernel pieces shared by the MoE routing kernels.

Every MoE kernel gives one lane one token: the lane walks its row of experts
serially (per-lane accumulators, strict ``>`` scans), so ties, summation order and
rounding are fixed by the body and identical on every target. Rows of a work tile
live in on-chip tiles whose rows are padded to 8 elements (32 bytes, the Ascend DMA
granule); DMA clamps the padding and the last tile's missing rows.

int64 tensors (expert indices) travel as int32 pairs (little-endian: low word,
then high word), so no kernel does 64-bit arithmetic.

Bad data that only a kernel sees (non-finite logits, out-of-range fixed indices,
replica counts outside the map, a layout larger than the rows given for it) sets a
word of a small ``status`` tensor; the dispatch raises after the launch. Lanes only
ever write 1 there, so concurrent writes agree.
"""


from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.shell import SIMT
from vmi_core.tl.simd import LaneVar, Vec, absolute, bitcast, fma, keep, maximum, minimum, select

# Tokens per work tile: the largest power of two up to 128 whose double-buffered row
# tiles fit the UB budget, so narrow gates keep more SIMT threads busy and wide ones fit.
# TileLang gives SIMT kernels 216 KiB of the 248 KiB UB; the rest of the budget is left
# to the per-worker tiles (bias rows, replica map).
TILE_BUDGET_BYTES = 176 * 1024
TILE_VERSIONS = 2
MAX_BLOCK_M = 128
CPU_BLOCK_M = 32
# The denominator's epsilon: turns an all-zero row's 0/0 into 0.
DENOM_EPS = 1e-20
# The lane count of the butterfly summation order (a CUDA warp).
BUTTERFLY_LANES = 32

# Words of the status tensor.
STATUS_NONFINITE = 0
STATUS_BAD_INDEX = 1
STATUS_BAD_COUNT = 2
STATUS_OVERFLOW = 3
STATUS_WORDS = 4

_NEG_INF_BITS = 0xFF800000
_POS_INF_BITS = 0x7F800000
_F32_MAX_BITS = 0x7F7FFFFF


def padded(n: int) -> int:
    """``n`` rounded up to whole 32-byte rows of 4-byte elements."""
    return (n + 7) // 8 * 8


def row_chunks(start: int, stop: int, row_elems: int):
    """``[lo, hi)`` row ranges covering ``[start, stop)`` whose element offsets fit int32."""
    step = max(1, (2**31 - 1) // max(1, padded(row_elems)) - MAX_BLOCK_M)
    return [(lo, min(lo + step, stop)) for lo in range(start, stop, step)]


def row_bytes(*widths: int) -> int:
    """Bytes one token takes in row tiles of ``widths`` 4-byte elements (rows padded to 32 bytes)."""
    return sum(4 * padded(w) for w in widths)


def kernel_rows(block_m: int, target: str) -> int:
    """Tokens per work tile of a kernel for ``target``: ``block_m``, at most ``CPU_BLOCK_M`` on cpu,
    where a tile is a stack array, not a share of the UB, and a decode-size call computes it whole.
    ``block_m`` is a multiple of it, so row ranges split at ``block_m`` keep whole tiles."""
    return min(block_m, CPU_BLOCK_M) if target == "cpu" else block_m


def tile_rows(token_bytes: int) -> int:
    """Tokens per work tile for ``token_bytes`` of row tiles per token (1 to 128)."""
    rows = MAX_BLOCK_M
    while rows > 1 and rows * token_bytes * TILE_VERSIONS > TILE_BUDGET_BYTES:
        rows //= 2
    return rows


@T.macro
def raise_flagged_rows(sh, bad, rows: int, num_valid, STATUS, word: int):
    """``STATUS[word] = 1`` where a lane's row below ``num_valid`` flagged ``bad[i] > 0``: one lane per
    row of the tile, in SIMT (a global store from vector code on Ascend). Rows past the token count
    hold stale data, or nothing (not computed)."""
    with sh.vector(SIMT):
        for i in T.Parallel(rows):
            if i < num_valid and bad[i] > 0:
                STATUS[word] = 1


def clamp(index, low: int, high: int):
    """``index`` kept in ``[low, high]``: a gather by data stays inside its tile, which also
    lets the compiler see that lanes never touch each other's rows."""
    return T.max(T.min(index, high), low)


def neg_inf():
    return F.f32_from_bits(F.u32(_NEG_INF_BITS))


def is_nonfinite(x):
    """NaN or +-inf, from the bit pattern (no float compare a compiler could drop)."""
    return F.abs_bits(x) > F.u32(_F32_MAX_BITS)


def is_nan(x):
    """NaN, from the bit pattern."""
    return F.abs_bits(x) > F.u32(_POS_INF_BITS)


def pos_inf():
    return F.f32_from_bits(F.u32(_POS_INF_BITS))


def next_in_rank(at, key, n: int, last_value: LaneVar, last_column: LaneVar):
    """Advance the pick ``(last_value, last_column)`` of the row at ``at`` to the next entry of
    ``key[row, :n]`` in rank order: descending key, equal keys by ascending column.

    The pick starts at ``(+inf, -1)``. A strict ``>`` scan in increasing column order over the
    entries ranked after the last pick keeps the first maximum (lane-generic: one row per lane,
    ``Shell.rowwise``). The row is only read, at loop-indexed columns: no lane reads where another
    writes, so a token's loop needs no barrier.
    """
    best = LaneVar(at.vector, "float32", neg_inf())
    # Kept only past the last finite key (bad input, flagged elsewhere): stay in the row.
    arg = LaneVar(at.vector, "int32", maximum(last_column.get(), 0))
    with T.serial(n) as e:
        k = keep(at.load(key, e))
        last = keep(last_value.get())
        ranked_after = (k < last) | ((k == last) & (last_column.get() < e))
        better = keep(ranked_after & (k > best.get()))
        best.set(select(better, k, best.get()))
        arg.set(select(better, e, arg.get()))
    last_value.set(best.get())
    last_column.set(arg.get())


@T.macro
def running_top_k(at, key, n: int, k: int, values, columns):
    """``columns[:k]`` = the columns of the first ``k`` entries of ``key[row, :n]`` in rank order
    (descending, equal keys by ascending column), for a scalar lane; ``values`` is ``k`` fp32 of
    scratch.

    One pass keeps a running list: an entry enters only if it beats the ``k``-th strictly (an equal
    one came first) and goes after every kept entry not below it, so a row costs about one compare
    per entry instead of ``next_in_rank``'s ``k`` scans. For finite keys both pick the same columns;
    a row with a non-finite key must take ``next_in_rank`` (a NaN neither beats nor loses).
    """
    for j in T.serial(k):
        values[j] = neg_inf()
        columns[j] = 0
    for e in T.serial(n):
        v = at.load(key, e)
        if v > values[k - 1]:
            # Slot j keeps its entry, takes the new one, or the one above it (from the bottom up,
            # so each reads the slot above before that changes).
            for step in T.serial(k - 1):
                j = k - 1 - step
                stays = values[j - 1] >= v
                columns[j] = T.Select(stays, T.Select(values[j] >= v, columns[j], e), columns[j - 1])
                values[j] = T.Select(stays, T.Select(values[j] >= v, values[j], v), values[j - 1])
            columns[0] = T.Select(values[0] >= v, columns[0], e)
            values[0] = T.Select(values[0] >= v, values[0], v)


def ordered_sum(terms: list, order: str):
    """``terms[0] + ... + terms[k-1]`` (``k <= 32``) as one expression tree in the flavor's order.

    ``sequential``: left to right. ``butterfly``: the 32-lane xor butterfly (masks 16,
    8, 4, 2, 1; lanes past ``k`` hold 0), whose lane 0 is what a warp reduction leaves;
    e.g. ``k = 6`` gives ``((v0 + v4) + v2) + ((v1 + v5) + v3)``. The parenthesisation
    is the rounding order: no target reassociates fp32 adds.
    """
    terms = list(terms)
    k = len(terms)
    if order == "sequential":
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total
    mask = BUTTERFLY_LANES // 2
    while mask:
        for j in range(min(mask, k)):
            if j + mask < k:
                terms[j] = terms[j] + terms[j + mask]
        mask //= 2
    return terms[0]


# Vector quotients below this are recomputed by ``_small_quotient``: the Ascend vector division
# flushes subnormal operands and results to zero, and residuals of quotients this small fall into
# the subnormal range, where they no longer tell the nearest neighbour.
_SMALL_QUOTIENT = 2.0**-100
# The dividend of a small quotient is scaled by 2^96: exact, and the scaled quotient and its
# residuals stay normal (|w / d| < 2^-100 with a finite d means |w| < 2^28).
_SMALL_SCALE_EXP = 96


def _nearest_by_residual(q, w, d):
    """``q`` or its neighbour below or above (by bit pattern), whichever has the smallest residual
    ``|fma(q', -d, w)|``; zeros, infinities and NaN stay (their neighbours are no candidates)."""
    magnitude = keep(bitcast(q, "int32") & 0x7FFFFFFF)
    lower = keep(F.f32_from_bits(F.f32_bits(q) - F.u32(1)))
    upper = keep(F.f32_from_bits(F.f32_bits(q) + F.u32(1)))
    err = keep(absolute(fma(q, -d, w)))
    err_lower = keep(absolute(fma(lower, -d, w)))
    pick = keep(select(err_lower < err, lower, q))
    pick = select(absolute(fma(upper, -d, w)) < minimum(err, err_lower), upper, pick)
    return select((magnitude > 0) & (magnitude < 0x7F800000), pick, q)


def _small_quotient(w, d):
    """``w / d`` correctly rounded for ``|w / d| < 2^-100`` (vector lanes): the quotient of the scaled
    dividend ``w 2^96`` is made nearest by its residual, then scaled back exactly (a normal result)
    or rounded onto the subnormal grid with the residual's sign as the sticky bit."""
    scaled = keep(w * F.f32_const(2.0**_SMALL_SCALE_EXP))
    q = keep(_nearest_by_residual(scaled / d, scaled, d))
    residual = keep(fma(q, -d, scaled))
    bits = keep(F.f32_bits(q))
    exp = keep((bits >> F.u32(23)) & F.u32(0xFF))
    significand = keep((bits & F.u32(0x7FFFFF)) | F.u32(0x800000))
    # The result in units of 2^-149 is significand * 2^(exp - 150 - 96 + 149): shift right by 97 - exp.
    shift = keep(minimum(F.like(F.u32(_SMALL_SCALE_EXP + 1), exp) - minimum(exp, F.u32(_SMALL_SCALE_EXP)),
                         F.u32(31)))
    kept = keep(significand >> shift)
    rest = keep(significand & ((F.like(F.u32(1), shift) << shift) - F.u32(1)))
    half = keep(F.like(F.u32(1), shift) << (shift - F.u32(1)))
    # Exactly on a midpoint of the subnormal grid, the exact quotient lies on the residual's side.
    # residual = d (exact - q): the exact quotient is larger in magnitude when residual, d and q
    # have the signs of a positive product.
    product_sign = (bits ^ F.f32_bits(d)) & F.u32(0x80000000)
    exact_above = residual * F.f32_from_bits(product_sign | F.u32(0x3F800000)) > 0
    tie_up = (rest == half) & (exact_above | ((residual == 0) & ((kept & F.u32(1)) == F.u32(1))))
    subnormal = F.f32_from_bits((bits & F.u32(0x80000000)) | (kept + F.flag((rest > half) | tie_up)))
    return select(exp > F.u32(_SMALL_SCALE_EXP), q * F.f32_const(2.0**-_SMALL_SCALE_EXP), subnormal)


def quotient(w, d, checked: bool):
    """``w / d``, correctly rounded (lane-generic).

    With ``checked`` (devices whose division is only nearly correct) a finite non-zero
    quotient is replaced by its neighbour below or above (by bit pattern) when that one's residual
    ``|fma(q', -d, w)|`` is strictly smaller. Where division is IEEE this changes nothing:
    a correctly rounded quotient has the smallest residual, and keeps it on the exact
    ties of the subnormal range. Vector lanes (Ascend, whose vector division flushes subnormals)
    with quotients below 2^-100 take ``_small_quotient``.
    """
    if not checked:
        return w / d
    w = keep(w)
    q = keep(_nearest_by_residual(keep(w / d), w, d))
    if not isinstance(q, Vec):
        return q
    return select(absolute(q) < F.f32_const(_SMALL_QUOTIENT), _small_quotient(w, d), q)
