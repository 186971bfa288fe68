"""``e^x`` of fp32 lane values, correctly rounded (to nearest even) for every binary32 input.

Built only from operations whose results every target documents bit for bit: fp32 add, sub, mul and
fma (round to nearest even), int32/uint32 integer and bit operations, compares and selects. No
hardware transcendental, no float64, no table in memory (tables are select trees on the index bits),
and no subnormal float arithmetic decides a result (subnormal results, overflow, NaN and ±inf come
from integer operations on the bits), so the same source gives the same bits on cpu, cuda and the
Ascend vector unit, with or without flush-to-zero. The torch twin is ``vmi_core.fp32.exp`` (float64
``exp`` rounded once, itself correctly rounded for every binary32 input: docs/numerics.md).

Two evaluations, both branch-free:

* ``exp_with_flag``: ``x = k·ln2/16 + r`` (``ln2/16`` split in three so ``x - k·L1`` and ``k·L2`` are exact),
  ``e^r - 1`` as a double-float with the cubic term exact, times ``2^(j/16) = Th + Tl``, giving
  ``e^x ≈ 2^E (hi + lo)`` within 2^-46.4 (relative). A bracket test, ``fl(S + fl(L ± D))`` with
  ``D = 2^-44.5·S``, decides the rounding unless e^x lies within about 2^-44 of a rounding boundary;
  then the lane is *hard* (511 of the 2^32 inputs).
* ``exp_exact``: ``ln2/32`` in four parts, a triple-float ``2^(j/32)``, ``e^r - 1`` by double-float
  Horner steps and an error-free summation: relative error below 2^-58.4 before a final rounding that
  goes through round-to-odd, so it is correctly rounded everywhere (the binary32 input closest to a
  rounding boundary lies 2^-52.64 from it).

``exp`` returns the fast result, or the exact one on hard lanes. Both are verified against the oracle
on every binary32 input (``nox -s exhaustive``); the default tests check the hard lanes, the special
values and a seeded sample on cpu and ascend-sim.
"""

from __future__ import annotations

import tilelang.language as T

from . import exp_constants as K
from .formats import f32_const, u32
from .simd import Pred, Vec, bitcast, fma, select, simd
from .simd import keep as _keep_scalar

_SHIFT = 12582912.0  # adding it leaves round(x·N/ln2) in the low mantissa bits
_XMIN = -104.0  # e^-104 < 2^-150: below it e^x rounds to +0
_DELTA = float.fromhex("0x1.6a09e6p-45")  # 2^-44.5: half-width of the bracket, relative to S
_F32_ABS, _F32_INF, _QUIET = 0x7FFFFFFF, 0x7F800000, 0x00400000


def keep(value):
    """``simd.keep``, but a vector value goes to a register variable (a flat store) rather than a
    let binding: TileLang's Ascend passes take time quadratic in the depth of nested lets."""
    if isinstance(value, Vec):
        var = simd().alloc_var(value.dtype)
        T.buffer_store(var, value.expr, [0])
        return Vec(var[0])
    return _keep_scalar(value)


def _c(value: float):
    return f32_const(value)


def _bits(x):
    return bitcast(x, "uint32")


def _float(bits):
    return bitcast(bits, "float32")


def _two_prod_error(a, b, p):
    """``a·b - p`` exactly, for ``p = fl(a·b)``."""
    return fma(a, b, -p)


def _fast_sum_error(a, b, s):
    """``a + b - s`` exactly, for ``s = fl(a + b)`` and ``|a| >= |b|`` (Fast2Sum)."""
    return keep(b - keep(s - a))


def _two_sum_error(a, b, s):
    """``a + b - s`` exactly, for ``s = fl(a + b)`` (TwoSum, any order)."""
    bb = keep(s - a)
    return keep(keep(a - keep(s - bb)) + keep(b - bb))


def _both(a, b):
    """``a and b`` per lane, without the short-circuit ``&&`` a scalar ``&`` of conditions becomes
    in C (its branches stop GCC vectorizing the element loop)."""
    if isinstance(a, Pred):
        return a & b
    return (T.Cast("uint32", a) & T.Cast("uint32", b)) != u32(0)


def _index_bits(j, count: int) -> list:
    return [keep((j & u32(1 << b)) != u32(0)) for b in range(count)]


def _lookup(column, bit: list):
    """``column[j]`` by a binary tree of selects on ``j``'s bits (constants at the leaves)."""
    level = [_c(v) for v in column]
    for b in bit:
        level = [keep(select(b, level[i + 1], level[i])) for i in range(0, len(level), 2)]
    return level[0]


def _reduce(x, n: int):
    """``kf`` (``k`` as fp32), ``k`` (int32) and ``r1 = x - k·L1`` (exact) for ``k = round(x·n/ln2)``."""
    t = keep(fma(x, _c(getattr(K, f"INV_{n}")), _c(_SHIFT)))
    kf = keep(t - _c(_SHIFT))
    k = keep(bitcast(_bits(t) - u32(0x4B400000), "int32"))  # bits of _SHIFT
    r1 = keep(fma(-kf, _c(getattr(K, f"L1_{n}")), x))
    return kf, k, r1


def exp_with_flag(x):
    """``(y, hard)``: ``y`` is ``e^x`` correctly rounded wherever ``hard`` is false."""
    kf, k, r1 = _reduce(x, 16)
    dh = keep(-kf * _c(K.L2_16))  # exact: L2 has 9 bits, |k| < 2^15
    rh = keep(r1 + dh)
    rl = keep(fma(-kf, _c(K.L3_16), _fast_sum_error(r1, dh, rh)))
    # e^rh - 1 = rh + rh^2/2 + rh^3/6 + rh^4·Q(rh) = ph + pl, the head rh + (rh^2/2 + rh^3/6) kept exact.
    s = keep(rh * rh)
    se = keep(_two_prod_error(rh, rh, s))
    hs = keep(0.5 * s)
    s3 = keep(s * rh)
    s3e = keep(_two_prod_error(s, rh, s3))
    c = keep(s3 * _c(K.C3))
    ce = keep(_two_prod_error(s3, _c(K.C3), c))
    a = keep(hs + c)
    ae = _fast_sum_error(hs, c, a)
    ph = keep(rh + a)
    e1 = _fast_sum_error(rh, a, ph)
    q = fma(rh, fma(rh, fma(rh, _c(K.C7), _c(K.C6)), _c(K.C5)), _c(K.C4))
    small = fma(_c(K.C3), fma(se, rh, s3e), ce)
    small = fma(s3, _c(K.C3L), small)
    small = keep(fma(0.5, se, small + ae))
    pl = keep(fma(s * s, q, e1 + small))
    pl = keep(pl + fma(rl, ph, rl))
    # times 2^(j/16) = Th + Tl
    bit = _index_bits(bitcast(k, "uint32") & u32(15), 4)
    th = _lookup([row[0] for row in K.T16], bit)
    tl = _lookup([row[1] for row in K.T16], bit)
    m = keep(th * ph)
    me = keep(_two_prod_error(th, ph, m))
    hi = keep(th + m)
    err = _fast_sum_error(th, m, hi)
    u = fma(th, pl, fma(tl, ph, me))
    lo = keep(keep(err + tl) + u)
    e = keep(k >> T.int32(4))
    # The bracket test: every value between fl(S + fl(L - D)) and fl(S + fl(L + D)) rounds alike.
    sub, cb, c_sub = _subnormal_grid(x, e)
    big = keep(c_sub + hi)
    low = keep(_fast_sum_error(c_sub, hi, big) + lo)
    d = keep(big * _c(_DELTA))
    ra = keep(big + keep(low + d))
    rb = keep(big + keep(low - d))
    hard = _both(_both(_bits(ra) != _bits(rb), x >= _c(_XMIN)), x <= _c(K.XMAX))
    return _finish(x, _bits(ra), e, sub, cb), hard


def _subnormal_grid(x, e):
    """For results below 2^-126 (``x <= XSUB``), ``C = 2^(-126-E)``: adding it to ``hi`` in
    ``[1, 2)`` rounds at absolute 2^-149 after scaling by ``2^E``, so subnormal results are rounded
    by normal arithmetic. ``(sub, bits of C, C)``; ``C = 0`` for normal results."""
    sub = keep(x <= _c(K.XSUB))
    cb = keep((bitcast(1 - e, "uint32")) << u32(23))
    return sub, cb, keep(_float(select(sub, cb, u32(0))))


def _finish(x, rounded_bits, e, sub, cb):
    """Scale the rounded significand by ``2^E`` in integer arithmetic (a carry into the exponent is
    right; 2^128 becomes +inf's pattern; a subnormal's pattern is its significand), then the
    specials: overflow, underflow to +0, NaN quieted."""
    # Each select on operands bound beforehand: a C ternary over expressions is evaluated lazily,
    # and GCC does not vectorize the branches a nest of them becomes.
    scaled = keep(rounded_bits + (bitcast(e, "uint32") << u32(23)))
    y = keep(select(sub, keep(rounded_bits - cb), scaled))
    y = keep(select(x > _c(K.XMAX), u32(_F32_INF), y))
    y = keep(select(x < _c(_XMIN), u32(0), y))
    xb = keep(_bits(x))
    return _float(select((xb & u32(_F32_ABS)) > u32(_F32_INF), keep(xb | u32(_QUIET)), y))


def _round_to_odd(t, te):
    """``t + te`` rounded to odd at ``t``'s precision, for a TwoSum pair (``|te| <= ulp(t)/2``):
    keeps every rounding threshold of a later addition on the side the exact sum is on."""
    tb, eb = keep(_bits(t)), keep(_bits(te))
    inexact = (eb << u32(1)) != u32(0)
    even = (tb & u32(1)) == u32(0)
    away = ((eb ^ tb) >> u32(31)) == u32(0)  # te has t's sign: the odd neighbour is away from 0
    step = keep(select(away, u32(1), u32(0xFFFFFFFF)))
    return keep(_float(tb + keep(select(_both(inexact, even), step, u32(0)))))


def exp_exact(x):
    """``e^x`` correctly rounded for every binary32 ``x`` (see the module docstring)."""
    kf, k, r1 = _reduce(x, 32)
    nk = keep(-kf)
    # r = rh + rl + rll
    dh = keep(nk * _c(K.L2_32))  # exact
    rh = keep(r1 + dh)
    t1 = _fast_sum_error(r1, dh, rh)
    p3 = keep(nk * _c(K.L3_32))
    p3e = keep(_two_prod_error(nk, _c(K.L3_32), p3))
    rl = keep(t1 + p3)
    rll = keep(_two_sum_error(t1, p3, rl) + fma(nk, _c(K.L4_32), p3e))
    # U = e^rh - 1 - rh = (s + se)·V, V = 1/2 + rh·W, W = 1/6 + rh·X, X = 1/24 + rh·(1/120 + ...)
    s = keep(rh * rh)
    se = keep(_two_prod_error(rh, rh, s))
    xl = keep(fma(rh, fma(rh, fma(rh, _c(K.C7), _c(K.C6)), _c(K.C5)), _c(K.C4L)))
    p = keep(rh * _c(K.C4))
    pe = keep(_two_prod_error(rh, _c(K.C4), p))
    wh = keep(p + _c(K.C3))
    wl = keep(_fast_sum_error(_c(K.C3), p, wh) + (fma(rh, xl, pe) + _c(K.C3L)))
    p = keep(rh * wh)
    pe = keep(_two_prod_error(rh, wh, p))
    vh = keep(0.5 + p)
    vl = keep(_fast_sum_error(_c(0.5), p, vh) + fma(rh, wl, pe))
    uh = keep(s * vh)
    ul = keep(_two_prod_error(s, vh, uh) + fma(s, vl, se * vh))
    # e^(rh + rho) - 1 = rh + U + rho + rho·(rh + U) + rho^2/2 + O(2^-66), rho = rl + rll: z is the
    # part past rh + U + rl
    z = keep(fma(rl, fma(0.5, rl, rh + uh), fma(rll, rh, rll)))
    # times 2^(j/32) = Th + Tm + Tt
    bit = _index_bits(bitcast(k, "uint32") & u32(31), 5)
    th, tm, tt = (_lookup([row[i] for row in K.T32], bit) for i in range(3))
    factors = ((th, rh), (th, uh), (th, rl), (tm, rh))
    a0, a1, a2, a3 = (keep(a * b) for a, b in factors)
    a0e, a1e, a2e, a3e = (keep(_two_prod_error(a, b, p)) for (a, b), p in zip(factors, (a0, a1, a2, a3), strict=True))
    h = keep(th + a0)
    e0 = _fast_sum_error(th, a0, h)
    h0 = keep(h + a1)
    e1 = _fast_sum_error(h, a1, h0)
    # the terms near 2^-24, summed without error: Tm, e0, e1, a0e, a2, a3
    m = keep(tm + e0)
    c1 = _two_sum_error(tm, e0, m)
    m2 = keep(m + e1)
    c2 = _two_sum_error(m, e1, m2)
    g = keep(a0e + a2)
    c3 = _two_sum_error(a0e, a2, g)
    g2 = keep(g + a3)
    c4 = _two_sum_error(g, a3, g2)
    m3 = keep(m2 + g2)
    c5 = _two_sum_error(m2, g2, m3)
    # the rest, smallest first
    rest = keep(keep(keep(keep(c1 + c2) + keep(c3 + c4)) + keep(c5 + tt)) + keep(a2e + a3e))
    rest = keep(fma(tm, rl, fma(tt, rh, rest)))
    rest = keep(fma(tm, uh, a1e + rest))
    lo = keep(fma(th, ul, fma(th, z, rest)))
    hi = keep(h0 + m3)
    mid = _fast_sum_error(h0, m3, hi)
    # RN(hi + mid + lo) through round-to-odd steps, on the subnormal grid for subnormal results
    m0 = keep(mid + lo)
    mid_odd = _round_to_odd(m0, _two_sum_error(mid, lo, m0))
    e = keep(k >> T.int32(5))
    sub, cb, c_sub = _subnormal_grid(x, e)
    big = keep(c_sub + hi)
    e2 = _fast_sum_error(c_sub, hi, big)
    tail = keep(e2 + mid_odd)
    tail_odd = _round_to_odd(tail, _two_sum_error(e2, mid_odd, tail))
    return _finish(x, _bits(keep(big + tail_odd)), e, sub, cb)


def exp(x):
    """``e^x`` of an fp32 lane value (a scalar expression or a ``Vec``), correctly rounded."""
    x = keep(x)
    y, hard = exp_with_flag(x)
    return select(hard, exp_exact(x), y)
