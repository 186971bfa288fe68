"""``rstd = 1 / sqrt(S / hidden + eps)`` of an fp32 square sum as a lane-generic kernel function
(quant-b spec §3, §4.2).

``rstd(sum_sq, hidden, eps, flavor)`` takes a lane value (``vmi_core.tl.simd``): a scalar
expression in a ``T.Parallel`` body (cpu, cuda, Ascend SIMT) or a 64-lane vector register in an
Ascend SIMD region, e.g. one square sum per row under ``Shell.rowwise``. ``hidden`` and ``eps``
are Python numbers the kernel is specialised on; they are checked when the kernel is built
(``eps >= 2^-126``, ``1 <= hidden <= 2^24``: ``vmi_core.rstd.rstd_constants``).

* ``ascend`` flavor, §3: with host constants ``rc_hi + rc_lo = 1 / hidden`` and
  ``e_hi + e_lo = eps`` (fp32 pairs split in Python double), ``v + ve`` carries
  ``S / hidden + eps`` (TwoSum of ``S rc_hi + e_hi``, the exact product error by FMA, the low
  parts), ``r0 = 1 / sqrt(v)`` (fp32 sqrt, then fp32 division) and one Newton step on the
  residual ``1 - (v + ve)(r2 + r2e)`` (``r2 + r2e = r0^2`` exactly) in fused multiply-adds. Every
  step is one fp32 operation, kept in its own variable or register so that no compiler or
  simplifier reassociates it. FMAs are ``vmi_core.tl.simd.fma``: ``fmaf`` on scalars (libm's,
  correctly rounded, on ``cpu``, whose build forbids implicit contraction; ``fma.rn.f32`` on
  ``cuda``; the SIMT API's on Ascend), ``vmula`` on vectors; the vector square root is the
  ``vsqrt`` instruction and the division TileLang's correctly rounded ``vdiv``.
  Accuracy (``tests/test_rstd.py``): correctly rounded in every test while
  ``2^-100 <= S / hidden + eps <= 2^100`` (the error stays below half an ulp plus ~2^-24 ulp);
  outside that range a compensation term falls under the fp32 subnormal grid, and the error
  stays below 1 ulp for ``hidden >= 4`` (measured 0.9989 ulp, for ``eps = 2^-126``).
  ``r0`` is only an estimate: a device ``vsqrt`` that is not correctly rounded (its accuracy is
  not documented; ascend-sim assumes it is) changes the bits of a few results, not the bound.
* ``cuda`` flavor, §4.2: ``rsqrt(f32(S / hidden) + f32(eps))``. ``T.rsqrt`` is ``rsqrtf`` on
  ``cuda`` (within 2 ulp of ``1 / sqrt``, CUDA's documented bound) and ``1.0f / sqrtf(a)`` on
  ``cpu``: off the GPU the cuda flavor is ``f32(1 / f32(sqrt(a)))``, within 2.5 ulp of the exact
  rstd (measured 1.99). Ascend targets always run the ascend flavor, so this flavor has no
  vector form.

With ``S = +inf`` or NaN the ascend flavor gives NaN, the cuda flavor 0 and NaN. On ``cuda``,
nvcc contracts products into following additions by default, so the ascend flavor is not
bit-exact there, which is fine since ``cuda`` always runs the cuda flavor.

The torch twins (bit for bit on ``cpu`` and ``ascend-sim``) and the float64 reference live in
``vmi_core.rstd``.
"""

from __future__ import annotations

from ..rstd import RstdConstants, rstd_constants
from ..targets import get_flavor
from .formats import f32_const, like
from .lazy import T
from .simd import Vec, fma, keep, sqrt


def _rstd_ascend(s, c: RstdConstants):
    s = keep(s)
    rc_hi, e_hi = f32_const(c.rc_hi), f32_const(c.e_hi)
    p = keep(s * rc_hi)                             # 1. p = S rc_hi; v = p + e_hi
    v = keep(p + e_hi)
    t = keep(v - p)                                 # 2. TwoSum error of p + e_hi
    vt = keep(v - t)
    err1 = keep(p - vt)
    err2 = keep(like(e_hi, t) - t)
    se = keep(err1 + err2)
    pe = keep(fma(s, rc_hi, -p))                    # 3. exact product error, then the low parts
    ve = keep(pe + se)
    ve = keep(fma(s, f32_const(c.rc_lo), ve))
    if c.e_lo:                                      #    (eps exact in fp32: nothing to add)
        ve = keep(ve + f32_const(c.e_lo))
    root = keep(sqrt(v))                            # 4. estimate: fp32 sqrt, then fp32 division
    r0 = keep(like(f32_const(1.0), root) / root)
    r2 = keep(r0 * r0)                              # 5. r0^2 = r2 + r2e exactly
    r2e = keep(fma(r0, r0, -r2))
    nv = keep(-v)                                   # 6. res = 1 - (v + ve)(r2 + r2e)
    nve = keep(-ve)
    res = keep(fma(nv, r2, f32_const(1.0)))
    res = keep(fma(nv, r2e, res))
    res = keep(fma(nve, r2, res))
    res = keep(fma(nve, r2e, res))
    half = keep(r0 * f32_const(0.5))                # 7. one Newton step
    return fma(half, res, r0)


def _rstd_cuda(s, c: RstdConstants):
    if isinstance(s, Vec):
        raise ValueError("the cuda flavor of rstd has no vector form: Ascend targets run the ascend flavor")
    mean = keep(s / f32_const(float(c.hidden)))
    a = keep(mean + f32_const(c.e_hi))
    return T.rsqrt(a)


def rstd(sum_sq, hidden: int, eps: float, flavor="ascend"):
    """``1 / sqrt(sum_sq / hidden + eps)`` of an fp32 lane value, as ``flavor`` computes it.

    ``hidden``, ``eps`` and ``flavor`` are fixed at trace time; a bad ``hidden`` or ``eps`` raises
    (``TypeError``/``ValueError``) while the kernel is built.
    """
    constants = rstd_constants(hidden, eps)
    if get_flavor(flavor).name == "cuda":
        return _rstd_cuda(sum_sq, constants)
    return _rstd_ascend(sum_sq, constants)
