"""The per-entry forward arithmetic of ``pre_split_mixes`` (spec §3.8.2) on fp32 lane values, shared
with the kernels that fuse the split (``pre_big_fuse``) so that they give its bits.

Every step is one rounded fp32 operation, the same on both flavors except for the division of the
sigmoid (``vmi_mhc.tl.sigmoid``). The torch twin is ``vmi_mhc.reference.pre_split_mixes``.
"""

from __future__ import annotations

from vmi_core.tl.simd import keep


def logit(x, gain, bias):
    """``fl(fl(x · gain) + bias)``: two roundings, the product kept in its own variable or register
    so that no compiler fuses it into the addition."""
    return keep(keep(x * gain) + bias)


def pre_mix(s, pre_eps):
    """``fl(σ + pre_eps)`` of a sigmoid value ``s = σ(z)`` (``pre_eps`` an fp32 value)."""
    return s + pre_eps


def post_mix(s, post_mult):
    """``fl(σ · post_mult)`` of a sigmoid value ``s = σ(z)`` (``post_mult`` an fp32 value)."""
    return s * post_mult
