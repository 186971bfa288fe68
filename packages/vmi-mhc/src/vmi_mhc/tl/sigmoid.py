"""The mHC sigmoid ``σ(z) = 1 / (exp(-z) + 1)`` of fp32 lane values (spec §5.1).

Used for the pre and post mixes (``pre_split_mixes``) and, bit for bit, by the ops that fuse or
repeat them (``head_compute_mix``, ``pre_big_fuse``). CUDA writes ``1 / (1 + exp(-z))`` and Ascend
``1 / (exp(0 - z) + 1)``: the same bits given the same exp (``0 - z`` and ``-z`` differ only for
``z = +0``, where exp gives 1 either way; the addition commutes). The exp is the correctly
rounded one of ``vmi_core.tl.elementary`` (torch twin ``vmi_core.fp32.exp``), which the kernels
take a tile at a time (``Shell.exp``: on Ascend a SIMT phase between their SIMD phases) before
``sigmoid_of_exp``.

The division is the flavor's: IEEE on the ``cuda`` flavor; on the ``ascend`` flavor the Ascend
vector division (``vmi_core.tl.formats.ascend_quotient``: subnormal results flushed to the zero
of their sign, ``z < -87.3``, and the residual check that can move quotients below about 2^-100
by an ulp), which SIMD regions run and scalar code models. The torch twin is
``vmi_mhc.reference.pre_split_mixes.sigmoid``.
"""

from __future__ import annotations

from vmi_core.tl.formats import flavor_quotient
from vmi_core.tl.simd import keep


def sigmoid_of_exp(exp_neg_z, flush_division: bool, in_simd: bool):
    """``σ(z) = fl(1 / fl(exp(-z) + 1))`` of an fp32 lane value, given ``exp(-z)``; ``flush_division``:
    the ``ascend`` flavor's division, modelled outside SIMD regions (``in_simd`` False) and the vector
    division itself inside them."""
    return flavor_quotient(1.0, keep(exp_neg_z + 1.0), flush_division, in_simd)
