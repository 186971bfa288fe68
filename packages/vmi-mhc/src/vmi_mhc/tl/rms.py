"""The RMS step of ``norm_fn`` (spec §3.4.2) as lane-generic kernel functions.

Every function takes lane values (``vmi_core.tl.simd``): scalar expressions in a ``T.Parallel``
body (cpu, cuda, Ascend SIMT) or 64-lane vector registers in an Ascend SIMD region. ``group_size``
(``K = n·H``), ``eps`` and ``flavor`` are fixed when the kernel is built. The reduce forward and
backward kernels and the fused ``pre_big_fuse`` call these functions, so that they agree bit for
bit. Every step is one fp32 operation, bound once (``keep``): no reassociation, no contraction
into a fused multiply-add (the cpu build forbids implicit contraction; Ascend vector code issues
the instructions as written).

The torch twins are ``vmi_mhc.reference.norm_fn.rms_scale`` and ``sqrsum_grad``.
"""

from __future__ import annotations

import numpy as np

from vmi_core.targets import get_flavor
from vmi_core.tl import formats as F
from vmi_core.tl.simd import Vec, keep, select, sqrt

_SIGN = 0x80000000
_MIN_NORMAL_BITS = 0x00800000


def f32(value: float) -> float:
    """``value`` rounded to fp32 (as a Python float)."""
    return float(np.float32(value))


def split_sum(running, partial):
    """One step of the split-K reduction ``Σ_s P_s`` (splits ascending from +0.0): ``running + P_s``."""
    return running + partial


def rms_scale(sqrsum, group_size: int, eps: float, flavor: str):
    """``r = 1 / sqrt(sqrsum / K + eps)`` as ``flavor`` computes it.

    * ``ascend``: ``1 / sqrt(f32(f32(sqrsum · f32(1/K)) + f32(eps)))``;
    * ``cuda``: ``1 / sqrt(f32(f32(sqrsum / K) + f32(eps)))``. TileKernels' CUDA kernel calls
      ``rsqrtf``, which is not correctly rounded; here it is the correctly rounded square root, then
      the correctly rounded division, on every target (``sqrtf`` and ``/`` without fast math on
      ``cuda``), within 1.5 ulp of the exact value of its rounded argument.

    The Ascend vector division flushes subnormal operands and quotients to zero; here it never
    meets one: ``sqrt(v)`` is 0 or at least ``2^-75`` and ``1 / sqrt(v)`` is above ``2^-64``.
    """
    eps_f = F.f32_const(f32(eps))
    sq = keep(sqrsum)
    if get_flavor(flavor).name == "ascend":
        mean = keep(sq * F.f32_const(f32(1.0 / group_size)))
    else:
        mean = keep(sq / F.f32_const(float(group_size)))
    v = keep(mean + F.like(eps_f, mean))
    root = keep(sqrt(v))
    return F.like(F.f32_const(1.0), root) / root


def _flush(value):
    """A subnormal fp32 value as the zero of its sign (scalar code modelling the Ascend division)."""
    bits = keep(F.f32_bits(keep(value)))
    return F.f32_from_bits(select((bits & F.u32(0x7FFFFFFF)) < F.u32(_MIN_NORMAL_BITS), bits & F.u32(_SIGN), bits))


def _divide(num, den, flavor: str):
    # The ascend flavor models the Ascend vector division, which flushes subnormal operands and
    # quotients to signed zero (the vector form is that instruction and does it by itself).
    if get_flavor(flavor).name != "ascend" or isinstance(num, Vec) or isinstance(den, Vec):
        return num / den
    return _flush(_flush(num) / _flush(den))


def sqrsum_grad(dot, r, sqrsum, group_size: int, eps: float, flavor: str):
    """``d_sqrsum = ((Σ_j g·out_mul) · r) / (sqrsum + f32(eps·K)) / (−2)`` of the per-token dot
    product ``dot`` and scale ``r`` (``rms_scale``), each step one fp32 operation; the ascend
    flavor's divisions flush subnormal operands and quotients to zero."""
    eps_k = F.f32_const(f32(eps * group_size))
    scaled = keep(dot * r)
    den = keep(sqrsum + F.like(eps_k, sqrsum))
    quotient = keep(_divide(scaled, den, flavor))
    return _divide(quotient, F.like(F.f32_const(-2.0), quotient), flavor)
