"""Single fp32 operations in torch with the rounding a kernel gives them: the torch twins of
``vmi_core.tl.simd.fma``, ``vmi_core.tl.exp`` and ``vmi_core.tl.log1p`` (the kernels' exp and log1p,
``vmi_core.tl.elementary``), and the subnormal flush of the Ascend vector division (twin of
``vmi_core.tl.formats.flush_subnormal``) and that division itself (``ascend_quotient``, twin of
``vmi_core.tl.formats.ascend_quotient``).

torch has no fused multiply-add, and its float32 ``exp``/``log1p`` are not correctly rounded (within
an ulp), so none can serve as the oracle of a kernel that is bit-exact. All are computed in float64:

* ``fma``: ``a * b`` is exact in float64; ``s = a * b + c`` is rounded once, and TwoSum gives its
  error ``e`` exactly, so ``a * b + c = s + e``. Rounding ``s`` to fp32 is right unless ``s`` is
  the midpoint of two fp32 neighbours (a midpoint is a float64 number, so any midpoint between
  ``s`` and the exact value would be nearer to it than ``s``): then ``e`` says on which side the
  exact value lies, and a zero ``e`` leaves the tie to even.
* ``exp``: the float64 exponential rounded once to fp32. The float64 result is within an ulp of
  float64, so the fp32 rounding could differ from the correct one only where the exact value lies
  within about 2^-52 (relative) of a midpoint of two fp32 numbers; the exhaustive check of
  ``vmi_core.tl.exp`` (``nox -s exhaustive``) settles every input near one with mpmath and finds
  none misrounded: correctly rounded for every binary32 input.
* ``log1p``: likewise float64 ``log1p`` rounded once, which the exhaustive check of
  ``vmi_core.tl.log1p`` finds misrounded on nine binary32 inputs (``LOG1P_MISROUNDED``); their
  correctly rounded results are written down here, so the twin is correctly rounded for every
  binary32 input.
"""

from __future__ import annotations

import math
import struct

import torch

from .formats import f32_bits, f32_from_bits
from .targets import Flavor, get_flavor

_SIGN = -0x80000000  # bit 31 as an int32 mask
_MIN_NORMAL_BITS = 0x00800000


def value(x: float) -> float:
    """The Python float ``x`` rounded once to fp32 (to nearest even; +-inf past the largest finite
    fp32), as a Python float: the value a kernel's fp32 scalar argument holds. Plain Python, so an
    op's validation runs no torch operation (``vmi_core.plan``)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # rounds past the largest finite fp32
        return math.copysign(math.inf, x)


def round_held(x: torch.Tensor) -> torch.Tensor:
    """A float64 tensor rounded to fp32 and held in float64 again."""
    return x.to(torch.float32).to(torch.float64)


def fma_held(a: torch.Tensor, b, c) -> torch.Tensor:
    """``f32(a * b + c)`` with one rounding, of fp32 values held in float64 (result held too)."""
    prod = a * b
    s = prod + c
    t = s - prod
    e = (prod - (s - t)) + (c - t)
    r = s.to(torch.float32)
    rd = r.to(torch.float64)
    toward = torch.where(s > rd, torch.inf, -torch.inf).to(torch.float32)
    other = torch.nextafter(r, toward)
    tie = (s != rd) & ((s - rd) == (other.to(torch.float64) - s))
    take_other = tie & (e != 0) & ((e > 0) == (other > r))
    return torch.where(take_other, other, r).to(torch.float64)


def _check_f32(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` of float32 tensors (broadcast) with one rounding, as float32.

    Raises:
        TypeError: an operand is not a float32 tensor.
    """
    for name, t in (("a", a), ("b", b), ("c", c)):
        _check_f32(name, t)
    return fma_held(a.double(), b.double(), c.double()).to(torch.float32)


def exp(x: torch.Tensor) -> torch.Tensor:
    """``e^x`` of a float32 tensor, correctly rounded to float32 (subnormal results kept).

    Raises:
        TypeError: ``x`` is not a float32 tensor.
    """
    _check_f32("x", x)
    return torch.exp(x.double()).to(torch.float32)


# The binary32 inputs (bit patterns) whose float64 ``log1p`` rounded once to binary32 is not the
# correctly rounded result, each with that result's bit pattern: mpmath's ``log1p`` at 200 bits rounded
# to binary32 (``vmi_devkit.lane_kernels.round_f32``), computed once; packages/vmi-core/tests/test_log1p.py
# recomputes them and proves (nox -s exhaustive) that these are all such inputs.
LOG1P_MISROUNDED = {
    0x35400003: 0x353FFFFF,
    0x3710001B: 0x370FFFF3,
    0x3EFD81AD: 0x3ECDEEE1,
    0x41078FEB: 0x400FE5E7,
    0x65D890D3: 0x4254D1F9,
    0x6F31A8EC: 0x42845A89,
    0xB53FFFFD: 0xB5400001,
    0xB70FFFE5: 0xB710000D,
    0xBB0EC8C4: 0xBB0EF0A5,
}


def log1p(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + x)`` of a float32 tensor, correctly rounded to float32 (``-1`` gives -inf, below it NaN).

    Raises:
        TypeError: ``x`` is not a float32 tensor.
    """
    _check_f32("x", x)
    y = torch.log1p(x.double()).to(torch.float32)
    keys = torch.tensor(list(LOG1P_MISROUNDED), dtype=torch.int64, device=x.device)
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    hit = torch.isin(bits, keys)
    if bool(hit.any()):
        fixed = torch.tensor(list(LOG1P_MISROUNDED.values()), dtype=torch.int64, device=x.device)
        sorted_keys, order = keys.sort()
        at = order[torch.searchsorted(sorted_keys, bits[hit])]
        y[hit] = f32_from_bits(fixed[at])
    return y


def division_flushes_subnormals(flavor: str | Flavor) -> bool:
    """Whether the flavor divides as the Ascend vector division does (``ascend_quotient``: subnormal
    operands and results flushed to signed zero) rather than as IEEE 754 says (CUDA)."""
    return get_flavor(flavor).name == "ascend"


def flush_subnormal(t: torch.Tensor) -> torch.Tensor:
    """fp32 ``t`` with every subnormal value replaced by the zero of its sign."""
    bits = f32_bits(t)
    subnormal = (bits & 0x7FFFFFFF) < _MIN_NORMAL_BITS
    return f32_from_bits(torch.where(subnormal, bits & _SIGN, bits))


def ascend_quotient(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """The Ascend fp32 vector division (TileLang's ``vdiv_0ulp_ftz_true``) of float32 tensors:
    the instruction's quotient ``q`` (subnormal operands and result flushed to signed zero,
    correctly rounded), then its neighbour below or above by bit pattern where that one's residual
    ``|fma(q', -d, n)|`` is smaller (below: also where equal). Only where the residuals underflow
    (quotients below about 2^-100) does this move a correctly rounded quotient. Zeros, infinities
    and NaN stay. The twin of ``vmi_core.tl.formats.ascend_quotient``."""
    numerator, denominator = torch.broadcast_tensors(numerator, denominator)
    q = flush_subnormal(flush_subnormal(numerator) / flush_subnormal(denominator))
    bits = q.view(torch.int32)
    below, above = (bits - 1).view(torch.float32), (bits + 1).view(torch.float32)
    neg = -denominator
    residual, residual_below = fma(q, neg, numerator).abs(), fma(below, neg, numerator).abs()
    keep_q = residual < residual_below
    best = torch.where(keep_q, residual, residual_below)
    pick = torch.where(keep_q, q, below)
    pick = torch.where(fma(above, neg, numerator).abs() < best, above, pick)
    return torch.where((q == 0) | q.isinf() | q.isnan(), q, pick)


def divide(numerator: torch.Tensor, denominator: torch.Tensor, flavor: str | Flavor) -> torch.Tensor:
    """The flavor's fp32 quotient of float32 tensors: IEEE (``cuda``) or the Ascend vector
    division (``ascend``, ``ascend_quotient``)."""
    if division_flushes_subnormals(flavor):
        return ascend_quotient(numerator, denominator)
    return numerator / denominator
