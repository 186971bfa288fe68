"""Lane values the mHC kernels' per-token phases share: in SIMD regions one token per vector lane,
elsewhere one token per thread or loop iteration (``at`` is the element position of
``Shell.elementwise`` / ``Shell.rowwise``)."""

from __future__ import annotations

from vmi_core.tl.lazy import T
from vmi_core.tl.simd import Vec, bitcast, keep
from vmi_core.tl.vector import gather, load, store


def load_token_lanes(tile, row, at):
    """``tile[row, token]`` for the token(s) at ``at``, of a tile that holds one token per column
    (the vector form loads the register of token lanes whole)."""
    return load(tile[row, at.row0]) if at.vector else tile[row, at.i]


def store_token_lanes(tile, row, at, value):
    """``tile[row, token] = value`` for the token(s) at ``at`` (one token per column)."""
    if at.vector:
        T.evaluate(store(tile[row, at.row0], value))
    else:
        T.buffer_store(tile, value, [row, at.i])


def zero(at):
    """+0.0 in the lane(s) at ``at``."""
    return Vec.splat(0.0, "float32") if at.vector else T.float32(0)


class BiasTable:
    """Entry ``i`` (an int or a loop variable) of an on-chip fp32 table of at most 64 biases, in
    every lane of ``at``: in vector code a register gather from the table's first register (loaded
    once), elsewhere the table entry."""

    def __init__(self, biases, at):
        self.biases, self.at = biases, at
        self.register = keep(load(biases[0])) if at.vector else None

    def __getitem__(self, i):
        if self.at.vector:
            return gather(self.register, bitcast(Vec.splat(i, "int32"), "uint32"))
        return self.biases[i]
