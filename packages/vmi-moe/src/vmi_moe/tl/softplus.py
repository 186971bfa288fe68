"""``y = sqrt(softplus(x))`` and its derivative from ``y`` as kernel macros (MoE spec §1).

Each flavor keeps TileKernels' operation order, with the correctly rounded ``exp``/``log1p`` of
vmi-core, so a kernel gives the same bits on every target and the torch twins of
``vmi_moe.softplus`` reproduce them:

* ``cuda`` forward (§1.2): ``sqrt(x > 20 ? x : log1p(exp(x)))`` in fp32.
* ``ascend`` forward (§1.3): ``a = exp(-|x|/2)``, a degree-8 FMA Horner polynomial
  in ``t = 1 - a^2`` for ``sqrt(ln(1 + a^2))``, and for ``x > 0`` a Newton-refined
  square root of ``x + l^2``; no threshold, non-zero tail down to x ~ -206.6.
* backward, both flavors (§1.5): a minimax polynomial for ``u = y^2 < 1``, else
  ``(1 - exp(-u)) / y / 2``; both branches are computed and selected on ``u < 1``.

How the pieces lower (TileLang 0.1.15, read from the generated source):

* ``exp`` / ``log1p``: ``vmi_core.tl.elementary``'s, correctly rounded (to nearest even,
  subnormal results kept) from fp32 add, sub, mul, fma, int32 operations and selects, called as
  functions the kernel defines: no ``expf``/``log1pf`` or other library or hardware
  transcendental on any target (``vmi_core.tools.source_checks.transcendental_calls``).
* Fused multiply-add: ``T.call_pure_extern("float32", "fmaf", a, b, c)``, i.e. a call
  of ``fmaf``: C's (libm, correctly rounded) on ``cpu``, the CUDA math library's (one
  ``fma.rn.f32``) on ``cuda`` and the SIMT API's (``__fma``) in the ``__simt_vf__``
  function on ``ascend``. ``T.fma`` / ``T.ieee_fmaf`` would give ``__fmaf_rn`` on
  ``cuda`` but are unresolved calls (``tl.fma``) on ``c`` and ``ascend``.
* ``T.sqrt``: ``sqrtf`` on all three targets (``cpu`` needs ``tirx.disable_vectorize``, which
  ``vmi_core.compile`` sets): IEEE, correctly rounded (the Ascend SIMT ``sqrtf`` is assumed so:
  vmi-core's README, "SIMT float arithmetic").
* Constants: see ``f32_const`` (the C code generator prints fp32 literals inexactly).

The macros keep their intermediates in ``T.alloc_var`` scalars and use per-element
scalar math only, so they belong in SIMT regions (``Shell.vector("simt")``) and in
``T.Parallel`` loops on ``cpu``/``cuda``, not in ``T.Parallel`` SIMD bodies.

The torch twins live in ``vmi_moe.softplus``.
"""

from __future__ import annotations

from vmi_core.targets import get_flavor
from vmi_core.tl.elementary import exp, log1p
from vmi_core.tl.formats import f32_const
from vmi_core.tl.lazy import T
from vmi_core.tl.simd import fma, maximum

SQRT_LN2 = 0.8325546383857727
"""fp32(sqrt(ln 2)) exactly: y(0), and the constant term G0 of the Ascend polynomial."""

CUDA_THRESHOLD = 20.0

# Ascend forward (§1.3): P(t) coefficients c8 ... c0, highest degree first.
ASCEND_P = (4.71802573883906e-4, -4.226923920214176e-4, -8.536428504157811e-5, 2.192076062783599e-3,
            2.92900949716568e-4, 4.986039828509092e-3, 1.1144610121846199e-2, 3.287079185247421e-2,
            1.1599518358707428e-1)

# Backward (§1.5): Q(u) coefficients q5 ... q0, highest degree first.
BACKWARD_Q = (1.29130945e-4, -1.30112655e-3, 8.27621203e-3, -4.1647464e-2, 1.66663632e-1, -4.99999821e-1)


def horner_fma(coeffs, t):
    """``p = coeffs[0]``, then ``p = fma(p, t, coeffs[k])`` for the rest (highest degree first)."""
    p = f32_const(coeffs[0])
    for coeff in coeffs[1:]:
        p = fma(p, t, f32_const(coeff))
    return p


# --- forward ----------------------------------------------------------------------------------
#
# Intermediates live in ``T.alloc_var`` scalars: TileLang's Simplify inlines let bindings,
# which would copy each shared subexpression into every use (a 90 kB expression for the
# Ascend forward). Stores to a local variable are kept, in program order. A product that
# feeds a sum gets its own statement, so that a C compiler contracting within expressions
# (clang's default -ffp-contract=on) cannot fuse what the spec rounds twice.

@T.macro
def sqrt_softplus_forward_cuda(x):
    """CUDA flavor, spec §1.2: ``sqrt(x > 20 ? x : log1p(exp(x)))`` in fp32.

    Strict ``>`` 20 as ``F.softplus(x)`` (beta 1, threshold 20); ``exp(x)`` overflows
    above ~88.7 only in the discarded branch, and underflows to 0 below ~-104 (subnormal
    below ~-87.3, kept). Both branches are computed, then selected.
    """
    sp = T.alloc_var(T.float32)
    sp = T.if_then_else(x > f32_const(CUDA_THRESHOLD), x, log1p(exp(x)))
    return T.sqrt(sp)


@T.macro
def sqrt_softplus_forward_ascend(x):
    """Ascend flavor, spec §1.3 steps 1-7, in the spec's order of fp32 operations.

    ``exp`` keeps subnormal results (as the ``ftz_false`` flag on Ascend), ``sqrt`` is
    the plain square root, and ``1 / r0`` is a plain division (only an estimate is
    needed: the Newton step and the FMA residual correct it; for ``x > 0`` it is normal,
    so the device's flush-to-zero division gives the same bits). ``x = 0`` gives
    ``SQRT_LN2`` exactly; ``x = +inf`` gives NaN, as on the device. Unfused products
    and sums must stay unfused: on ``cuda`` (nvcc contracts by default) this flavor is
    therefore not bit-exact, which is fine since ``cuda`` always runs the cuda flavor.
    """
    a = T.alloc_var(T.float32)
    t = T.alloc_var(T.float32)
    g = T.alloc_var(T.float32)
    l = T.alloc_var(T.float32)
    s = T.alloc_var(T.float32)
    r0 = T.alloc_var(T.float32)
    rho = T.alloc_var(T.float32)
    r1 = T.alloc_var(T.float32)
    a = exp(T.abs(x) * f32_const(-0.5))                   # 1. a = e^(-|x|/2)
    t = a * a
    t = f32_const(1.0) - t                                   # 2. t = 1 - e^(-|x|)
    g = fma(t, horner_fma(ASCEND_P, t), f32_const(SQRT_LN2))  # 3-4. g = sqrt(ln(1 + q) / q)
    l = a * g                                           # 5. l = sqrt(ln(1 + e^(-|x|)))
    s = fma(l, l, maximum(x, f32_const(0.0)))                # 6. s = relu(x) + l^2, one rounding
    r0 = T.sqrt(s)
    rho = f32_const(1.0) / r0
    r1 = s * rho
    r1 = (r0 + r1) * f32_const(0.5)                          #    one Newton step
    # y = r1 + (r1^2 - s) * (-1 / (2 r0)): the residual is exact in one FMA; 7. select on x > 0
    return T.if_then_else(x > f32_const(0.0), fma(fma(r1, r1, -s), rho * f32_const(-0.5), r1), l)


# --- backward ---------------------------------------------------------------------------------

@T.macro
def _backward(y):
    u = T.alloc_var(T.float32)
    h = T.alloc_var(T.float32)
    small = T.alloc_var(T.float32)
    large = T.alloc_var(T.float32)
    u = y * y
    h = f32_const(0.5) * y
    small = fma(u * horner_fma(BACKWARD_Q, u), h, h)   # A: (y/2) (1 + u Q(u))
    large = ((f32_const(1.0) - exp(-u)) / y) * f32_const(0.5)  # B: (1 - e^(-u)) / (2y)
    return T.if_then_else(u < f32_const(1.0), small, large)


@T.macro
def sqrt_softplus_backward_cuda(y):
    """CUDA flavor, spec §1.5: ``dy/dx`` from ``y`` (branch A for ``u = y^2 < 1``, else B).

    TileKernels writes ``q = q*u + q_k`` and ``(u*q)*h + h`` and relies on nvcc's
    contraction (its backward kernel enables fast-math); the macro spells out the
    FMAs that contraction produces, so every target gives the contracted bits. Branch
    B is ``fl(fl(fl(1 - exp(-u)) / y) * 0.5)`` with the correctly rounded ``exp`` and an
    IEEE division (under fast-math nvcc would use its approximate ``exp`` and division
    there). ``y = 0`` gives +0.0 exactly.
    """
    return _backward(y)


@T.macro
def sqrt_softplus_backward_ascend(y):
    """Ascend flavor, spec §1.5: explicit FMA Horner and ``fma(fl(u*q), h, h)`` for
    ``u < 1``, else ``fl(fl(fl(1 - exp(-u)) / y) * 0.5)`` with the correctly rounded
    ``exp`` and an IEEE division. The device uses flush-to-zero ``exp`` and division there;
    for ``u >= 1`` that only matters for ``y > 2^125``, whose derivative is subnormal (kept
    here). ``y = 0`` gives +0.0 exactly.
    """
    return _backward(y)


_FORWARD = {"cuda": sqrt_softplus_forward_cuda, "ascend": sqrt_softplus_forward_ascend}
_BACKWARD = {"cuda": sqrt_softplus_backward_cuda, "ascend": sqrt_softplus_backward_ascend}


def sqrt_softplus_forward(x, flavor="ascend"):
    """``sqrt(softplus(x))`` of an fp32 scalar expression; ``flavor`` is fixed at trace time."""
    return _FORWARD[get_flavor(flavor).name](x)


def sqrt_softplus_backward(y, flavor="ascend"):
    """``d sqrt(softplus(x)) / dx`` from the forward output ``y`` (fp32, ``y >= 0``)."""
    return _BACKWARD[get_flavor(flavor).name](y)
