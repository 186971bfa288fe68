"""Exact-arithmetic building blocks of the correctly rounded functions (``vmi_core.tl.exp``,
``vmi_core.tl.log1p``), on fp32 lane values (scalar expressions or ``Vec`` registers).

Error-free transformations (the rounding error of a product or a sum as an fp32 value), round to
odd, and tables as binary trees of selects on an index's bits (constants at the leaves: no memory
table, no gather). Written for code that must vectorize on cpu: conditions combine without C's
short-circuit ``&&`` and every select's operands are bound beforehand (a C ternary over expressions
is evaluated lazily, and GCC does not vectorize the branches a nest of them becomes).
"""

from __future__ import annotations

from .formats import f32_bits, f32_const, f32_from_bits, u32
from .lazy import T
from .simd import Pred, Vec, fma, select, simd
from .simd import keep as keep_bound


def keep_flat(value):
    """``vmi_core.tl.simd.keep``, but a vector value goes to a register variable (a flat store)
    rather than a let binding: TileLang's Ascend passes take time quadratic in the depth of nested
    lets, and these functions bind hundreds of values."""
    if isinstance(value, Vec):
        var = simd().alloc_var(value.dtype)
        T.buffer_store(var, value.expr, [0])
        return Vec(var[0])
    return keep_bound(value)


def both(a, b):
    """``a and b`` per lane, without the short-circuit ``&&`` a scalar ``&`` of conditions becomes
    in C (its branches stop GCC vectorizing the element loop)."""
    if isinstance(a, Pred):
        return a & b
    return (T.Cast("uint32", a) & T.Cast("uint32", b)) != u32(0)


def two_prod_error(a, b, p):
    """``a·b - p`` exactly, for ``p = fl(a·b)``."""
    return fma(a, b, -p)


def fast_sum_error(a, b, s):
    """``a + b - s`` exactly, for ``s = fl(a + b)`` and ``|a| >= |b|`` (Fast2Sum)."""
    return keep_flat(b - keep_flat(s - a))


def two_sum_error(a, b, s):
    """``a + b - s`` exactly, for ``s = fl(a + b)`` (TwoSum, any order)."""
    bb = keep_flat(s - a)
    return keep_flat(keep_flat(a - keep_flat(s - bb)) + keep_flat(b - bb))


def round_to_odd(t, te):
    """``t + te`` rounded to odd at ``t``'s precision, for a TwoSum pair (``|te| <= ulp(t)/2``):
    keeps every rounding threshold of a later addition on the side the exact sum is on."""
    tb, eb = keep_flat(f32_bits(t)), keep_flat(f32_bits(te))
    inexact = (eb << u32(1)) != u32(0)
    even = (tb & u32(1)) == u32(0)
    away = ((eb ^ tb) >> u32(31)) == u32(0)  # te has t's sign: the odd neighbour is away from 0
    step = keep_flat(select(away, u32(1), u32(0xFFFFFFFF)))
    return keep_flat(f32_from_bits(tb + keep_flat(select(both(inexact, even), step, u32(0)))))


def index_bits(j, count: int) -> list:
    return [keep_flat((j & u32(1 << b)) != u32(0)) for b in range(count)]


def select_table(column, bit: list):
    """``column[j]`` by a binary tree of selects on ``j``'s bits (constants at the leaves)."""
    level = [f32_const(v) for v in column]
    for b in bit:
        level = [keep_flat(select(b, level[i + 1], level[i])) for i in range(0, len(level), 2)]
    return level[0]


def constant_like(value: float, lanes):
    """The fp32 constant ``value`` bound to a variable like ``lanes``: a register of splats for a
    ``Vec`` (a scalar constant cannot be the left operand of a vector operation), a scalar variable
    otherwise (TVM would fold ``0 + y`` to ``y``, which differs from the study for ``y = -0``)."""
    c = f32_const(value)
    return keep_flat(Vec.splat(c, "float32") if isinstance(lanes, Vec) else c)
