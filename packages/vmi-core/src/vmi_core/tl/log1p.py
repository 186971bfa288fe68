"""``log(1 + x)`` of fp32 lane values, correctly rounded (to nearest even) for every binary32 input.

Built, like ``vmi_core.tl.exp``, only from operations whose results every target documents bit for
bit: fp32 add, sub, mul and fma, int32/uint32 integer and bit operations, compares and selects. No
hardware transcendental, no float64, no table in memory (the tables are select trees on the index
bits), no branch, so the same source is meant to give the same bits on cpu, cuda and the Ascend vector
unit, with or without flush-to-zero (checked on cpu and ascend-sim). The oracle is torch's float64
``log1p`` rounded once, which is correctly rounded for all but nine binary32 inputs (``0x35400003
0x3710001b 0x3efd81ad 0x41078feb 0x65d890d3 0x6f31a8ec 0xb53ffffd 0xb70fffe5 0xbb0ec8c4``: there the
double lies too close to a binary32 rounding boundary, and the correctly rounded value comes from
mpmath).

One evaluation, with a relative error below 2^-60 before the final rounding (2^-60.3 at worst in the
study's sampled measurement). That bound alone does not cover the inputs closest to a rounding
boundary (``±0x1.800006p-21`` lie 2^-66.4 from one, relative, in the series range, where the
evaluation is far more accurate): correct rounding rests on the exhaustive check.

* ``|x| < 2^-24`` (±0 and subnormals included): ``log1p(x)`` rounds to ``x``, returned as is.
* ``2^-24 <= |x| < 2^-7``, the series: ``r = x``.
* ``|x| >= 2^-7``, the table: ``1 + x = a + b`` exactly (TwoSum); ``a = 2^E·z`` with ``z`` in
  ``[0.703, 1.406)`` by the bits of ``a``; five index bits ``i`` pick ``C_i ≈ 1/z``;
  ``z·C_i - 1 + b·2^-E·C_i = rh + rho1 + rho2`` exactly (TwoProd, TwoSums), ``|rh| <= 2^-6``; then
  ``log1p(x) = E·ln2 - log C_i + log1p(rh) + rho·w - rho1^2/2`` with ``w = 1/(1 + rh)``.
* ``log1p(rh) = rh - (s + se)/2 + rh^3·G(rh)`` with ``rh^2 = s + se`` exactly, ``G`` by five
  double-float Horner steps (1/3 .. 1/7) over a float tail (1/8 .. 1/13), ``rh^3·G`` a double-float.
* Every term is summed exactly by a TwoSum accumulator ``(H, M)`` with a float tail ``L``, and the
  final rounding of ``H + M + L`` goes through round-to-odd (as in ``exp_exact``).

Specials: ``x = -1`` gives -inf, ``x < -1`` (and -inf) the quiet NaN ``0x7FC00000``, +inf itself, a
NaN input itself quieted (``| 0x00400000``, as ``exp``). The operations and their order are those of
a C study checked on every binary32 input, with and without flush-to-zero; this source, on cpu, was
checked against the oracle on every binary32 input too.
"""

from __future__ import annotations

from . import log1p_constants as K
from .exact import constant_like, index_bits, keep_flat, round_to_odd, select_table, two_prod_error, two_sum_error
from .formats import f32_bits, f32_const, f32_from_bits, u32
from .lazy import T
from .simd import bitcast, cast, fma, select

_F32_ABS, _F32_INF, _QUIET = 0x7FFFFFFF, 0x7F800000, 0x00400000
_NEG_INF, _NAN = 0xFF800000, 0x7FC00000
_F32_MAX = float.fromhex("0x1.fffffep127")
_TINY = 0x33800000  # 2^-24: below it log1p(x) rounds to x
_SERIES = 0x3C000000  # 2^-7: below it the series, without the table




def _df_step(ch: float, cl: float, r, ah, al, lanes):
    """One double-float Horner step, ``(Yh, Yl) = (Ch + Cl) + r·(Ah + Al)`` (needs ``|r·A| < |Ch|``)."""
    p = keep_flat(r * ah)
    pe = keep_flat(two_prod_error(r, ah, p))
    yh = keep_flat(p + f32_const(ch))
    ye = keep_flat(keep_flat(constant_like(ch, lanes) - yh) + p)
    return yh, keep_flat(ye + keep_flat(fma(r, al, pe) + constant_like(cl, lanes)))


def _accumulate(h, m, low, t):
    """``(H, M) += T`` exactly, the error of the ``M`` addition added to the tail ``L``."""
    s1 = keep_flat(h + t)
    e1 = two_sum_error(h, t, s1)
    s2 = keep_flat(m + e1)
    e2 = two_sum_error(m, e1, s2)
    return s1, s2, keep_flat(low + e2)


def log1p_parts(x):
    """``(H, M, L)`` with ``H + M + L ≈ log1p(x)`` for ``2^-24 <= |x|``, ``x > -1`` finite (anything
    elsewhere)."""
    x = keep_flat(x)
    one = constant_like(1.0, x)
    ax = keep_flat(f32_bits(x) & u32(_F32_ABS))
    table = keep_flat(ax > u32(_SERIES - 1))  # (an unsigned ``<`` would become a division)
    # the table path: 1 + x = a + b
    a = keep_flat(one + x)
    b = two_sum_error(one, x, a)
    ab = keep_flat(f32_bits(a))
    t = keep_flat(ab - u32(K.OFF))
    e = keep_flat(bitcast(t, "int32") >> T.int32(23))
    i = keep_flat((t >> u32(18)) & u32(31))
    z = keep_flat(f32_from_bits(ab - keep_flat(bitcast(e, "uint32") << u32(23))))
    es = keep_flat(select(e > T.int32(126), T.int32(126), e))
    scale = keep_flat(f32_from_bits(bitcast(keep_flat(-es) + T.int32(127), "uint32") << u32(23)))
    bz = keep_flat(b * scale)  # b·2^-E, exact (for E > 126 negligible anyway)
    bit = index_bits(i, 5)
    c, lh, lm, ll = (select_table(column, bit) for column in (K.C, K.LH, K.LM, K.LL))
    p = keep_flat(z * c)
    pe = keep_flat(two_prod_error(z, c, p))
    r0 = keep_flat(p - f32_const(1.0))  # exact (Sterbenz)
    qh = keep_flat(bz * c)
    ql = keep_flat(two_prod_error(bz, c, qh))
    u = keep_flat(pe + qh)
    ue = two_sum_error(pe, qh, u)
    rh = keep_flat(r0 + u)
    rho1 = two_sum_error(r0, u, rh)
    rho2 = keep_flat(ue + ql)
    # the series path: r = x, nothing else (every select on operands bound beforehand)
    zero = f32_const(0.0)
    rh = keep_flat(select(table, rh, x))
    rho1 = keep_flat(select(table, rho1, zero))
    rho2 = keep_flat(select(table, rho2, zero))
    lh = keep_flat(select(table, lh, zero))
    lm = keep_flat(select(table, lm, zero))
    ll = keep_flat(select(table, ll, zero))
    ef = keep_flat(cast(e, "float32"))
    ef = keep_flat(select(table, ef, zero))
    # log1p(rh) = rh - (s + se)/2 + rh^3·G(rh)
    s = keep_flat(rh * rh)
    se = keep_flat(two_prod_error(rh, rh, s))
    g = f32_const(K.G13)
    for n in (12, 11, 10, 9, 8):
        g = fma(rh, g, f32_const(getattr(K, f"G{n}")))
    g = keep_flat(g)
    gh, gl = _df_step(K.G7, K.G7L, rh, g, zero, x)
    for n in (6, 5, 4, 3):
        gh, gl = _df_step(getattr(K, f"G{n}"), getattr(K, f"G{n}L"), rh, gh, gl, x)
    s3 = keep_flat(s * rh)  # rh^3 = s3 + s3e + se·rh
    s3e = keep_flat(two_prod_error(s, rh, s3))
    qh = keep_flat(s3 * gh)
    qe = keep_flat(two_prod_error(s3, gh, qh))
    ql = keep_flat(qe + fma(s3, gl, keep_flat(fma(se, rh, s3e) * gh)))
    # rho·(1/(1 + rh)) - rho1^2/2
    m1, p1 = f32_const(-1.0), f32_const(1.0)
    w1 = keep_flat(fma(rh, fma(rh, fma(rh, fma(rh, fma(rh, m1, p1), m1), p1), m1), p1))
    we = keep_flat(fma(-rh, w1, keep_flat(one - w1)))  # 1 - (1 + rh)·w1
    wl = keep_flat(w1 * we)  # w = w1 + wl
    ah = keep_flat(rho1 * w1)
    ae = keep_flat(two_prod_error(rho1, w1, ah))
    rsmall = keep_flat(fma(rho1, wl, fma(rho2, w1, keep_flat(keep_flat(-0.5 * ah) * ah))))
    # E·ln2
    e1 = keep_flat(ef * f32_const(K.LN1))  # exact
    e2 = keep_flat(ef * f32_const(K.LN2))  # exact
    e3 = keep_flat(ef * f32_const(K.LN3))
    e3e = keep_flat(two_prod_error(ef, f32_const(K.LN3), e3))
    e4 = keep_flat(ef * f32_const(K.LN4))
    # the exact accumulation
    h, m, low = e1, constant_like(0.0, x), constant_like(0.0, x)
    for term in (lh, rh, e2, keep_flat(-0.5 * s), qh, lm, e3, ah, keep_flat(-0.5 * se), ql):
        h, m, low = _accumulate(h, m, low, term)
    low = keep_flat(low + keep_flat(keep_flat(keep_flat(keep_flat(e3e + ll) + ae) + e4) + rsmall))
    return h, m, low


def log1p_with_parts(x):
    """``(log1p(x), H, M, L)``: the correctly rounded value and the parts of the sum it rounds."""
    x = keep_flat(x)
    h, m, low = log1p_parts(x)
    # the exact final rounding of H + M + L
    h2 = keep_flat(h + m)
    m2 = two_sum_error(h, m, h2)
    m0 = keep_flat(m2 + low)
    r = keep_flat(h2 + round_to_odd(m0, two_sum_error(m2, low, m0)))
    # the specials (integer equality tests on the bits here would let GCC thread the chain of
    # selects into branches: the float tests of the study)
    xb = keep_flat(f32_bits(x))
    ax = keep_flat(xb & u32(_F32_ABS))
    y = keep_flat(select(ax > u32(_TINY - 1), keep_flat(f32_bits(r)), xb))  # |x| < 2^-24: x (±0, subnormals)
    y = keep_flat(select(x == f32_const(-1.0), u32(_NEG_INF), y))
    y = keep_flat(select(x < f32_const(-1.0), u32(_NAN), y))
    y = keep_flat(select(x > f32_const(_F32_MAX), xb, y))  # +inf (an inf literal does not reach every target)
    return f32_from_bits(select(ax > u32(_F32_INF), keep_flat(xb | u32(_QUIET)), y)), h, m, low


def log1p(x):
    """``log(1 + x)`` of an fp32 lane value (a scalar expression or a ``Vec``), correctly rounded."""
    return log1p_with_parts(x)[0]
