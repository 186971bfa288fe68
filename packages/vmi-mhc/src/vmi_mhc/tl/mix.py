"""The stream mix ``Σ_m mix[m] · x[m]`` of one token's ``n`` residual streams, in fp32 lane values.

``pre_apply_mix``'s forward computes it, and the fused kernels that rebuild the layer input
(``pre_big_fuse``, ``multilayer_recompute``) call this same function, so that their results equal
``pre_apply_mix``'s bit for bit on every target. The chain differs between the flavors only in the
first term, which decides the sign of an all-zero sum:

* ``ascend``: ``acc = mix[0] · x[0]`` (a product), then ``acc = fma(mix[m], x[m], acc)`` for
  ``m = 1 .. n-1`` (the vector multiply-accumulate);
* ``cuda``: ``acc = +0``, then ``acc = fma(mix[m], x[m], acc)`` for every ``m`` (nvcc contracts
  ``acc += mix * x`` into a fused multiply-add).

The torch twin is ``vmi_mhc.reference.pre_apply_mix.stream_mix``.
"""

from __future__ import annotations

from vmi_core.tl.lazy import T
from vmi_core.tl.simd import LANES, Vec, fma
from vmi_core.tl.vector import ChunkAt, ElementAt


def row_at(at, row=None):
    """The position of ``at``'s column(s) in a tile row: row ``row`` of a 2-D tile, or a 1-D tile
    when ``row`` is None (``ChunkAt`` for vector code, ``ElementAt`` for a scalar lane)."""
    head = () if row is None else (row,)
    return ChunkAt(head, at.col0) if at.vector else ElementAt(head, at.j)


def stream_weight(mix, at, stream):
    """The weight of stream ``stream`` (an int or a loop variable) in every lane of ``at``, from the
    token's weights in a lane table ``mix`` (``Shell.lane_table``): vector code gathers it into
    the lanes (lane ``l`` of the chunk at column ``stream · LANES`` belongs to group ``stream``)."""
    if at.vector:
        return ChunkAt((), stream * LANES).group(mix, LANES)
    return mix[stream]


def stream_mix(flavor: str, mixes, streams):
    """``Σ_m mixes[m] · streams[m]`` in ``flavor``'s chain (module docstring), one fp32 lane value.

    ``mixes`` and ``streams`` are sequences of ``n`` fp32 lane values (scalars or ``Vec``); a mix
    weight is usually a per-token scalar, a stream value a decoded tile element.
    """
    if len(mixes) != len(streams) or not streams:
        raise ValueError(f"stream_mix takes one mix weight per stream, got {len(mixes)} and {len(streams)}")
    if flavor == "ascend":
        acc, first = streams[0] * mixes[0], 1
    elif flavor == "cuda":
        acc, first = (Vec.splat(0.0, "float32") if any(isinstance(s, Vec) for s in streams) else T.float32(0)), 0
    else:
        raise ValueError(f"flavor must be 'ascend' or 'cuda', got {flavor!r}")
    for m in range(first, len(streams)):
        acc = fma(mixes[m], streams[m], acc)
    return acc
