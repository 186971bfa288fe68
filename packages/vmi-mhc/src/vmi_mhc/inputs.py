"""Validation of the mHC ops' arguments (the generic checks are vmi_core.checks).

Everything here runs before any kernel: bad input raises ``TypeError`` (wrong type or dtype)
or ``ValueError`` (wrong shape, stride, device, size or option) naming the argument, and no
output is written.
"""

from __future__ import annotations

import torch

from vmi_core import fp32
from vmi_core.checks import check_float

MHC_MULT = 4
"""The stream count ``n`` the 4x4-specialised kernels (Sinkhorn, split, big fuse) are built for."""


def mix_width(mhc_mult: int) -> int:
    """Length ``n * (n + 2)`` of the per-token mix vector: n pre, n post and n*n comb entries."""
    return mhc_mult * (mhc_mult + 2)


def check_mhc_mult(mhc_mult: int, name: str, op: str) -> int:
    """``mhc_mult`` when it is the 4 streams ``op``'s kernel is specialised on (spec §6.5)."""
    if mhc_mult != MHC_MULT:
        raise ValueError(f"{op}: {name} must be {MHC_MULT} (the kernel is specialised on 4 streams), got {mhc_mult}")
    return mhc_mult

MAX_STREAMS = 16
"""The largest stream count ``n`` of the ops that take any (``expand``, ``pre_apply_mix``): each
``n`` is a kernel specialisation, and the per-token tiles grow with it."""


def check_streams(mhc_mult: int, name: str) -> int:
    """``mhc_mult`` when it is a stream count in ``[1, MAX_STREAMS]``."""
    if not 1 <= mhc_mult <= MAX_STREAMS:
        raise ValueError(f"{name} must be in [1, {MAX_STREAMS}] (the number of streams), got {mhc_mult}")
    return mhc_mult


F32_MAX = float(torch.finfo(torch.float32).max)
_MIN_NORMAL = 2.0 ** -126


def finite_fp32(value, name: str, *, non_negative: bool = False) -> float:
    """``value`` (a real number) as the fp32 scalar a kernel takes, when that is finite (and, with
    ``non_negative``, not below 0)."""
    value = check_float(value, name, finite=True)
    if non_negative and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    as_fp32 = fp32.value(value)
    if not abs(as_fp32) < float("inf"):
        raise ValueError(f"{name} must be finite as fp32, got {value}")
    return as_fp32


def post_mult_fp32(value) -> float:
    """``mhc_post_mult_value`` as fp32: 0 or a normal number (the split backward divides by it, and
    the Ascend division flushes a subnormal divisor)."""
    as_fp32 = finite_fp32(value, "mhc_post_mult_value")
    if (value != 0 and as_fp32 == 0) or 0 < abs(as_fp32) < _MIN_NORMAL:
        raise ValueError(f"mhc_post_mult_value must be 0 or at least 2^-126 in magnitude (a normal fp32 "
                         f"number), got {value}")
    return as_fp32


def check_rms_eps(value) -> float:
    """``rms_eps`` as the RMS kernels take it: a real number in ``[0, fp32 max]`` (rounded to fp32
    in the kernel)."""
    eps = check_float(value, "rms_eps", finite=True)
    if not 0.0 <= eps <= F32_MAX:
        raise ValueError(f"rms_eps must be in [0, {F32_MAX:.7g}], got {eps!r}")
    return eps
