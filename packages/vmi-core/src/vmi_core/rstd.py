"""``rstd = 1 / sqrt(S / hidden + eps)`` of an fp32 square sum ``S``, in torch (quant-b spec §3, §4.2).

The torch twins of the kernel function ``vmi_core.tl.rstd.rstd``, bit for bit on ``cpu`` and
``ascend-sim``:

* ``ascend`` flavor: the compensated rstd of spec §3, every step one fp32 operation. The value
  ``S / hidden + eps`` is carried as the unevaluated sum ``v + ve`` (TwoSum and the exact
  product error), ``r0 = 1 / sqrt(v)`` is refined by one Newton step on that sum, with the
  residual ``1 - (v + ve) r0^2`` accumulated in fused multiply-adds.
* ``cuda`` flavor: ``rsqrt(f32(S / hidden) + f32(eps))`` as TileKernels' CUDA kernel computes it.
  Off the GPU (``cpu``, and here) ``rsqrt(a)`` is ``f32(1 / f32(sqrt(a)))``, two correctly
  rounded operations; CUDA's ``rsqrtf`` is within its documented 2 ulp of ``1 / sqrt(a)``, so a
  GPU's bits may differ from these.

Accuracy against the exact rstd (``tests/test_rstd.py``): the ascend flavor is correctly rounded
in every test while ``2^-100 <= S / hidden + eps <= 2^100`` and below 1 ulp elsewhere (hidden >= 4;
measured 0.9989 ulp); the cuda flavor off the GPU is within 2.5 ulp (measured 1.99).

The fp32 operations run on fp32 values held in float64 and are rounded to fp32 after each
operation. That is one correct rounding for ``+ - * / sqrt`` (a product of two fp32 values is
exact in float64; for the others float64 has more than ``2 * 24 + 2`` bits, so rounding twice
gives the correctly rounded fp32 result). A fused multiply-add is not: ``a * b + c`` is rounded
to float64 first, and its float64 rounding error (TwoSum) decides the fp32 ties it creates
(``vmi_core.fp32.fma_held``).

``rstd_reference`` is the float64 value of the exact formula (relative error below 2^-50), the
high-precision reference tests bound both flavors against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .fp32 import fma_held as _fma
from .fp32 import round_held as _round
from .targets import Flavor, get_flavor

MIN_EPS = 2.0**-126
"""Smallest ``eps``: ``v = S / hidden + eps`` stays a normal number, as §3 needs."""
MAX_HIDDEN = 2**24
"""Largest ``hidden``: every hidden size up to it is exact in fp32 (the cuda flavor divides by it)."""
F32_MAX = float(np.finfo(np.float32).max)


def _f32(value: float) -> float:
    return float(np.float32(value))


def _split(value: float) -> tuple[float, float]:
    """``(hi, lo)``: ``hi = f32(value)``, ``lo = f32(value - hi)`` (the difference in Python double)."""
    hi = _f32(value)
    return hi, _f32(value - hi)


@dataclass(frozen=True)
class RstdConstants:
    """The host constants of §3: ``1 / hidden`` and ``eps`` each split into two fp32 values."""

    hidden: int
    eps: float
    rc_hi: float
    rc_lo: float
    e_hi: float
    e_lo: float


def rstd_constants(hidden: int, eps: float) -> RstdConstants:
    """The constants of one specialisation, after checking ``hidden`` and ``eps``.

    Raises:
        TypeError: ``hidden`` is not an int or ``eps`` not a real number.
        ValueError: ``hidden`` outside ``[1, 2^24]``; ``eps`` below 2^-126 (or NaN), or above the
            largest fp32 value.
    """
    if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)):
        raise TypeError(f"hidden must be an int, got {type(hidden).__name__}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    hidden, eps = int(hidden), float(eps)
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ValueError(f"hidden must be in [1, 2^24], got {hidden}")
    if not MIN_EPS <= eps <= F32_MAX:
        raise ValueError(f"eps must be in [2^-126, {F32_MAX:.7g}] (the compensated rstd needs "
                         f"S / hidden + eps to be a normal fp32 number), got {eps!r}")
    rc_hi, rc_lo = _split(1.0 / hidden)
    e_hi, e_lo = _split(eps)
    return RstdConstants(hidden, eps, rc_hi, rc_lo, e_hi, e_lo)


def _check_sum_sq(sum_sq: torch.Tensor) -> None:
    if not isinstance(sum_sq, torch.Tensor) or sum_sq.dtype != torch.float32:
        raise TypeError(f"sum_sq must be a float32 tensor, got {getattr(sum_sq, 'dtype', type(sum_sq).__name__)}")


def _rstd_ascend(s: torch.Tensor, c: RstdConstants) -> torch.Tensor:
    p = _round(s * c.rc_hi)                          # 1. p = S rc_hi; v = p + e_hi
    v = _round(p + c.e_hi)
    t = _round(v - p)                                # 2. TwoSum error of p + e_hi
    err1 = _round(p - _round(v - t))
    err2 = _round(c.e_hi - t)
    se = _round(err1 + err2)
    pe = _fma(s, c.rc_hi, -p)                        # 3. exact product error, then the low parts
    ve = _round(pe + se)
    ve = _fma(s, c.rc_lo, ve)
    if c.e_lo:
        ve = _round(ve + c.e_lo)
    r0 = _round(1.0 / _round(torch.sqrt(v)))         # 4. estimate
    r2 = _round(r0 * r0)                             # 5. r0^2 = r2 + r2e exactly
    r2e = _fma(r0, r0, -r2)
    res = _fma(-v, r2, torch.ones_like(v))           # 6. res = 1 - (v + ve)(r2 + r2e)
    res = _fma(-v, r2e, res)
    res = _fma(-ve, r2, res)
    res = _fma(-ve, r2e, res)
    return _fma(_round(0.5 * r0), res, r0)           # 7. one Newton step


def _rstd_cuda(s: torch.Tensor, c: RstdConstants) -> torch.Tensor:
    a = _round(_round(s / float(c.hidden)) + c.e_hi)
    return _round(1.0 / _round(torch.sqrt(a)))


def rstd(sum_sq: torch.Tensor, hidden: int, eps: float, flavor: str | Flavor = "ascend") -> torch.Tensor:
    """``1 / sqrt(sum_sq / hidden + eps)`` of a float32 tensor of square sums, as ``flavor`` computes it.

    Args:
        sum_sq: float32 square sums (``>= 0``), any shape and device.
        hidden: the number of terms each sum has (``1 <= hidden <= 2^24``).
        eps: the epsilon added to the mean square (``>= 2^-126``), a Python number.
        flavor: ``"ascend"`` (compensated, §3) or ``"cuda"`` (``rsqrt(f32(S / hidden) + eps)``).

    Returns:
        float32 rstd of ``sum_sq``'s shape, on its device.

    Raises:
        TypeError: ``sum_sq`` is not float32, or see ``rstd_constants``.
        ValueError: an unknown flavor, or see ``rstd_constants``.
    """
    _check_sum_sq(sum_sq)
    c = rstd_constants(hidden, eps)
    kind = get_flavor(flavor).name
    s = sum_sq.detach().to("cpu", torch.float64)
    out = _rstd_cuda(s, c) if kind == "cuda" else _rstd_ascend(s, c)
    return out.to(torch.float32).to(sum_sq.device)


def rstd_reference(sum_sq: torch.Tensor, hidden: int, eps: float) -> torch.Tensor:
    """``1 / sqrt(sum_sq / hidden + eps)`` in float64 (``eps`` the Python double): four float64
    roundings, a relative error below 2^-50, on the CPU."""
    _check_sum_sq(sum_sq)
    c = rstd_constants(hidden, eps)
    s = sum_sq.detach().to("cpu", torch.float64)
    return 1.0 / torch.sqrt(s / c.hidden + c.eps)

