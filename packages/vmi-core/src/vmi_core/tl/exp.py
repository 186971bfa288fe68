"""``e^x`` of fp32 lane values, correctly rounded (to nearest even) for every binary32 input.

Built only from operations whose results every target documents bit for bit: fp32 add, sub, mul and
fma (round to nearest even), int32/uint32 integer and bit operations, compares and selects. No
hardware transcendental, no float64, no table in memory (tables are select trees on the index bits),
and no subnormal float arithmetic decides a result (subnormal results, overflow, NaN and ±inf come
from integer operations on the bits), so the same source gives the same bits on cpu, cuda and the
Ascend vector unit, with or without flush-to-zero. The torch twin is ``vmi_core.fp32.exp`` (float64
``exp`` rounded once, itself correctly rounded for every binary32 input: docs/core.md).

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

Kernels call them as C functions printed from this lane code (``vmi_core.tl.elementary``: the fast
result or the exact one on hard lanes, and ``Shell.exp``, a tile at a time). Both evaluations are
verified against the oracle on every binary32 input (``nox -s exhaustive``); the default tests
check the hard lanes, the special values and a seeded sample on cpu and ascend-sim.
"""

from __future__ import annotations

from . import exp_constants as K
from .exact import (
    both,
    fast_sum_error,
    index_bits,
    keep_flat,
    round_to_odd,
    select_table,
    two_prod_error,
    two_sum_error,
)
from .formats import f32_bits, f32_const, f32_from_bits, u32
from .lazy import T
from .simd import bitcast, fma, select

_SHIFT = 12582912.0  # adding it leaves round(x·N/ln2) in the low mantissa bits
_XMIN = -104.0  # e^-104 < 2^-150: below it e^x rounds to +0
_DELTA = float.fromhex("0x1.6a09e6p-45")  # 2^-44.5: half-width of the bracket, relative to S
_F32_ABS, _F32_INF, _QUIET = 0x7FFFFFFF, 0x7F800000, 0x00400000


def _reduce(x, n: int):
    """``kf`` (``k`` as fp32), ``k`` (int32) and ``r1 = x - k·L1`` (exact) for ``k = round(x·n/ln2)``."""
    t = keep_flat(fma(x, f32_const(getattr(K, f"INV_{n}")), f32_const(_SHIFT)))
    kf = keep_flat(t - f32_const(_SHIFT))
    k = keep_flat(bitcast(f32_bits(t) - u32(0x4B400000), "int32"))  # bits of _SHIFT
    r1 = keep_flat(fma(-kf, f32_const(getattr(K, f"L1_{n}")), x))
    return kf, k, r1


def exp_with_flag(x):
    """``(y, hard)``: ``y`` is ``e^x`` correctly rounded wherever ``hard`` is false."""
    kf, k, r1 = _reduce(x, 16)
    dh = keep_flat(-kf * f32_const(K.L2_16))  # exact: L2 has 9 bits, |k| < 2^15
    rh = keep_flat(r1 + dh)
    rl = keep_flat(fma(-kf, f32_const(K.L3_16), fast_sum_error(r1, dh, rh)))
    # e^rh - 1 = rh + rh^2/2 + rh^3/6 + rh^4·Q(rh) = ph + pl, the head rh + (rh^2/2 + rh^3/6) kept exact.
    s = keep_flat(rh * rh)
    se = keep_flat(two_prod_error(rh, rh, s))
    hs = keep_flat(0.5 * s)
    s3 = keep_flat(s * rh)
    s3e = keep_flat(two_prod_error(s, rh, s3))
    c = keep_flat(s3 * f32_const(K.C3))
    ce = keep_flat(two_prod_error(s3, f32_const(K.C3), c))
    a = keep_flat(hs + c)
    ae = fast_sum_error(hs, c, a)
    ph = keep_flat(rh + a)
    e1 = fast_sum_error(rh, a, ph)
    q = fma(rh, fma(rh, fma(rh, f32_const(K.C7), f32_const(K.C6)), f32_const(K.C5)), f32_const(K.C4))
    small = fma(f32_const(K.C3), fma(se, rh, s3e), ce)
    small = fma(s3, f32_const(K.C3L), small)
    small = keep_flat(fma(0.5, se, small + ae))
    pl = keep_flat(fma(s * s, q, e1 + small))
    pl = keep_flat(pl + fma(rl, ph, rl))
    # times 2^(j/16) = Th + Tl
    bit = index_bits(bitcast(k, "uint32") & u32(15), 4)
    th = select_table([row[0] for row in K.T16], bit)
    tl = select_table([row[1] for row in K.T16], bit)
    m = keep_flat(th * ph)
    me = keep_flat(two_prod_error(th, ph, m))
    hi = keep_flat(th + m)
    err = fast_sum_error(th, m, hi)
    u = fma(th, pl, fma(tl, ph, me))
    lo = keep_flat(keep_flat(err + tl) + u)
    e = keep_flat(k >> T.int32(4))
    # The bracket test: every value between fl(S + fl(L - D)) and fl(S + fl(L + D)) rounds alike.
    sub, cb, c_sub = _subnormal_grid(x, e)
    big = keep_flat(c_sub + hi)
    low = keep_flat(fast_sum_error(c_sub, hi, big) + lo)
    d = keep_flat(big * f32_const(_DELTA))
    ra = keep_flat(big + keep_flat(low + d))
    rb = keep_flat(big + keep_flat(low - d))
    hard = both(both(f32_bits(ra) != f32_bits(rb), x >= f32_const(_XMIN)), x <= f32_const(K.XMAX))
    return _finish(x, f32_bits(ra), e, sub, cb), hard


def _subnormal_grid(x, e):
    """For results below 2^-126 (``x <= XSUB``), ``C = 2^(-126-E)``: adding it to ``hi`` in
    ``[1, 2)`` rounds at absolute 2^-149 after scaling by ``2^E``, so subnormal results are rounded
    by normal arithmetic. ``(sub, bits of C, C)``; ``C = 0`` for normal results."""
    sub = keep_flat(x <= f32_const(K.XSUB))
    cb = keep_flat((bitcast(1 - e, "uint32")) << u32(23))
    return sub, cb, keep_flat(f32_from_bits(select(sub, cb, u32(0))))


def _finish(x, rounded_bits, e, sub, cb):
    """Scale the rounded significand by ``2^E`` in integer arithmetic (a carry into the exponent is
    right; 2^128 becomes +inf's pattern; a subnormal's pattern is its significand), then the
    specials: overflow, underflow to +0, NaN quieted."""
    # Each select on operands bound beforehand: a C ternary over expressions is evaluated lazily,
    # and GCC does not vectorize the branches a nest of them becomes.
    scaled = keep_flat(rounded_bits + (bitcast(e, "uint32") << u32(23)))
    y = keep_flat(select(sub, keep_flat(rounded_bits - cb), scaled))
    y = keep_flat(select(x > f32_const(K.XMAX), u32(_F32_INF), y))
    y = keep_flat(select(x < f32_const(_XMIN), u32(0), y))
    xb = keep_flat(f32_bits(x))
    return f32_from_bits(select((xb & u32(_F32_ABS)) > u32(_F32_INF), keep_flat(xb | u32(_QUIET)), y))


def exp_exact(x):
    """``e^x`` correctly rounded for every binary32 ``x`` (see the module docstring)."""
    kf, k, r1 = _reduce(x, 32)
    nk = keep_flat(-kf)
    # r = rh + rl + rll
    dh = keep_flat(nk * f32_const(K.L2_32))  # exact
    rh = keep_flat(r1 + dh)
    t1 = fast_sum_error(r1, dh, rh)
    p3 = keep_flat(nk * f32_const(K.L3_32))
    p3e = keep_flat(two_prod_error(nk, f32_const(K.L3_32), p3))
    rl = keep_flat(t1 + p3)
    rll = keep_flat(two_sum_error(t1, p3, rl) + fma(nk, f32_const(K.L4_32), p3e))
    # U = e^rh - 1 - rh = (s + se)·V, V = 1/2 + rh·W, W = 1/6 + rh·X, X = 1/24 + rh·(1/120 + ...)
    s = keep_flat(rh * rh)
    se = keep_flat(two_prod_error(rh, rh, s))
    xl = keep_flat(fma(rh, fma(rh, fma(rh, f32_const(K.C7), f32_const(K.C6)), f32_const(K.C5)), f32_const(K.C4L)))
    p = keep_flat(rh * f32_const(K.C4))
    pe = keep_flat(two_prod_error(rh, f32_const(K.C4), p))
    wh = keep_flat(p + f32_const(K.C3))
    wl = keep_flat(fast_sum_error(f32_const(K.C3), p, wh) + (fma(rh, xl, pe) + f32_const(K.C3L)))
    p = keep_flat(rh * wh)
    pe = keep_flat(two_prod_error(rh, wh, p))
    vh = keep_flat(0.5 + p)
    vl = keep_flat(fast_sum_error(f32_const(0.5), p, vh) + fma(rh, wl, pe))
    uh = keep_flat(s * vh)
    ul = keep_flat(two_prod_error(s, vh, uh) + fma(s, vl, se * vh))
    # e^(rh + rho) - 1 = rh + U + rho + rho·(rh + U) + rho^2/2 + O(2^-66), rho = rl + rll: z is the
    # part past rh + U + rl
    z = keep_flat(fma(rl, fma(0.5, rl, rh + uh), fma(rll, rh, rll)))
    # times 2^(j/32) = Th + Tm + Tt
    bit = index_bits(bitcast(k, "uint32") & u32(31), 5)
    th, tm, tt = (select_table([row[i] for row in K.T32], bit) for i in range(3))
    factors = ((th, rh), (th, uh), (th, rl), (tm, rh))
    a0, a1, a2, a3 = (keep_flat(a * b) for a, b in factors)
    a0e, a1e, a2e, a3e = (keep_flat(two_prod_error(a, b, p))
                          for (a, b), p in zip(factors, (a0, a1, a2, a3), strict=True))
    h = keep_flat(th + a0)
    e0 = fast_sum_error(th, a0, h)
    h0 = keep_flat(h + a1)
    e1 = fast_sum_error(h, a1, h0)
    # the terms near 2^-24, summed without error: Tm, e0, e1, a0e, a2, a3
    m = keep_flat(tm + e0)
    c1 = two_sum_error(tm, e0, m)
    m2 = keep_flat(m + e1)
    c2 = two_sum_error(m, e1, m2)
    g = keep_flat(a0e + a2)
    c3 = two_sum_error(a0e, a2, g)
    g2 = keep_flat(g + a3)
    c4 = two_sum_error(g, a3, g2)
    m3 = keep_flat(m2 + g2)
    c5 = two_sum_error(m2, g2, m3)
    # the rest, smallest first
    rest = keep_flat(keep_flat(c1 + c2) + keep_flat(c3 + c4))
    rest = keep_flat(keep_flat(rest + keep_flat(c5 + tt)) + keep_flat(a2e + a3e))
    rest = keep_flat(fma(tm, rl, fma(tt, rh, rest)))
    rest = keep_flat(fma(tm, uh, a1e + rest))
    lo = keep_flat(fma(th, ul, fma(th, z, rest)))
    hi = keep_flat(h0 + m3)
    mid = fast_sum_error(h0, m3, hi)
    # RN(hi + mid + lo) through round-to-odd steps, on the subnormal grid for subnormal results
    m0 = keep_flat(mid + lo)
    mid_odd = round_to_odd(m0, two_sum_error(mid, lo, m0))
    e = keep_flat(k >> T.int32(5))
    sub, cb, c_sub = _subnormal_grid(x, e)
    big = keep_flat(c_sub + hi)
    e2 = fast_sum_error(c_sub, hi, big)
    tail = keep_flat(e2 + mid_odd)
    tail_odd = round_to_odd(tail, two_sum_error(e2, mid_odd, tail))
    return _finish(x, f32_bits(keep_flat(big + tail_odd)), e, sub, cb)
