"""The 4x4 Sinkhorn chain of the comb mix, per flavor, on lane values (kernel side).

One token's ``n x n`` logits are 16 lane values in row-major order (entry ``(j, k)`` at
``4 j + k``): fp32 scalars in a ``T.Parallel`` lane, or ``vmi_core.tl.simd.Vec`` registers of
64 tokens (one token per lane) in an Ascend SIMD region. ``sinkhorn`` is the forward that
``sinkhorn`` kernels and the fused ``pre_big_fuse`` run, so both give the same bits; the
backward kernel replays it through ``record``.

Per flavor (spec §3.9.2, §5.1):

* sums of a row or column of 4: ``ascend`` pairwise ``(a0 + a1) + (a2 + a3)`` (the vector
  unit's group add), ``cuda`` sequential ``((a0 + a1) + a2) + a3`` (a register loop);
* divisions: ``cuda`` IEEE; ``ascend`` the vector unit's, which flushes subnormal operands
  and quotients to signed zero (the vector form is that instruction; scalar code models it);
* ``exp(x - rowmax)``: correctly rounded (``vmi_core.tl.simd.exp``); the max of 4 is
  order-free.
"""

from __future__ import annotations

import tilelang.language as T

from vmi_core.tl import formats as F
from vmi_core.tl.simd import LaneVar, Vec, exp, keep, maximum, select

N = 4
ENTRIES = N * N
_MIN_NORMAL_BITS = 0x00800000


def rows(m: list) -> list[list]:
    """The 4 rows of a 4x4 matrix of lane values (row-major list of 16)."""
    return [m[N * j:N * j + N] for j in range(N)]


def columns(m: list) -> list[list]:
    """The 4 columns of a 4x4 matrix of lane values."""
    return [m[k::N] for k in range(N)]


def sum4(values: list, flavor: str):
    """The fp32 sum of 4 lane values in the flavor's tree."""
    a0, a1, a2, a3 = values
    if flavor == "ascend":
        return keep((a0 + a1) + (a2 + a3))
    return keep(((a0 + a1) + a2) + a3)


def _flush_subnormal(x):
    """A subnormal fp32 scalar as the zero of its sign."""
    x = keep(x)
    return select(F.abs_bits(x) < F.u32(_MIN_NORMAL_BITS), F.f32_from_bits(F.f32_bits(x) & F.u32(0x80000000)), x)


def divide(num, den, flavor: str):
    """The flavor's fp32 quotient ``num / den`` (see the module docstring)."""
    if isinstance(num, Vec) or isinstance(den, Vec) or flavor != "ascend":
        return keep(num / den)
    return keep(_flush_subnormal(_flush_subnormal(num) / _flush_subnormal(den)))


def softmax_rows(logits: list, flavor: str) -> list:
    """``exp(x - rowmax) / rowsum`` per row."""
    out = []
    for row in rows(logits):
        peak = keep(maximum(maximum(row[0], row[1]), maximum(row[2], row[3])))
        e = [keep(exp(x - peak)) for x in row]
        total = sum4(e, flavor)
        out += [divide(v, total, flavor) for v in e]
    return out


def normalize_rows(m: list, eps, flavor: str) -> tuple[list, list]:
    """``(m / (rowsum + eps), the 4 denominators)``."""
    dens = [keep(sum4(row, flavor) + eps) for row in rows(m)]
    return [divide(v, dens[i // N], flavor) for i, v in enumerate(m)], dens


def normalize_columns(m: list, eps, flavor: str) -> tuple[list, list]:
    """``(m / (colsum + eps), the 4 denominators)``."""
    dens = [keep(sum4(col, flavor) + eps) for col in columns(m)]
    return [divide(v, dens[i % N], flavor) for i, v in enumerate(m)], dens


def sinkhorn(logits: list, repeat, eps, flavor: str, record=None) -> list:
    """The Sinkhorn projection of one token's 16 logits (lane values), as 16 lane values.

    Softmax over each row, ``+ eps``, a column normalisation, then ``repeat - 1`` times a row
    and a column normalisation (each ``x / (sum + eps)``). ``repeat`` (>= 1) may be a runtime
    value. ``record(step, matrix, denominators)``, when given, sees every normalisation's input
    and denominators (step ``2R - 1`` the last; step 0 the softmax, without denominators): the
    backward's replay (spec §3.9.3).
    """
    vector = isinstance(logits[0], Vec)
    p = softmax_rows(logits, flavor)
    if record is not None:
        record(0, p, None)
    a = [keep(v + eps) for v in p]
    x, dens = normalize_columns(a, eps, flavor)
    if record is not None:
        record(1, a, dens)
    state = [LaneVar(vector, "float32", v) for v in x]
    with T.serial(repeat - 1) as q:
        m = [keep(s.get()) for s in state]
        by_rows, row_dens = normalize_rows(m, eps, flavor)
        by_cols, col_dens = normalize_columns(by_rows, eps, flavor)
        if record is not None:
            record(2 * q + 2, m, row_dens)
            record(2 * q + 3, by_rows, col_dens)
        for s, v in zip(state, by_cols, strict=True):
            s.set(v)
    return [s.get() for s in state]
