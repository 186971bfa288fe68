"""Validation of the mHC ops' arguments (the generic checks are vmi_core.checks).

Everything here runs before any kernel: bad input raises ``TypeError`` (wrong type or dtype)
or ``ValueError`` (wrong shape, stride, device, size or option) naming the argument, and no
output is written.
"""

from __future__ import annotations

import torch

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


def finite_fp32(value, name: str) -> float:
    """``value`` (a real number) as the fp32 scalar a kernel takes, when that is finite."""
    value = check_float(value, name, finite=True)
    as_fp32 = float(torch.tensor(value, dtype=torch.float32))
    if not abs(as_fp32) < float("inf"):
        raise ValueError(f"{name} must be finite as fp32, got {value}")
    return as_fp32
