"""The 4x4 Sinkhorn chain of the comb mix, per flavor, on lane values (kernel side).

One token's ``n x n`` logits are 16 lane values in row-major order (entry ``(j, k)`` at
``4 j + k``): fp32 scalars in a ``T.Parallel`` lane, or ``vmi_core.tl.simd.Vec`` registers of
64 tokens (one token per lane) in an Ascend SIMD region. The forward is ``softmax_shift`` (the
exps' arguments ``x - rowmax``), the exps a tile at a time (``Shell.exp``: the correctly rounded
exp is a function of scalar lanes), then ``sinkhorn_of_exps``; the ``sinkhorn`` kernels and the
fused ``pre_big_fuse`` run the same, so both give the same bits, and the backward kernel replays
it through ``record``.

Per flavor (spec §3.9.2, §5.1):

* sums of a row or column of 4: ``ascend`` pairwise ``(a0 + a1) + (a2 + a3)`` (the vector
  unit's group add), ``cuda`` sequential ``((a0 + a1) + a2) + a3`` (a register loop);
* divisions: ``cuda`` IEEE; ``ascend`` the Ascend vector division (TileLang's default
  ``vdiv_0ulp_ftz_true``: the division instruction, which flushes subnormal operands and
  quotients to signed zero, and a residual check of the quotient's neighbours, which moves it by
  an ulp where the residuals underflow); the vector form is that division, scalar code models it
  (``vmi_core.tl.formats.ascend_quotient``);
* ``exp(x - rowmax)``: correctly rounded (``vmi_core.tl.elementary``); the max of 4 is
  order-free.
"""

from __future__ import annotations

from vmi_core.tl import formats as F
from vmi_core.tl.lazy import T
from vmi_core.tl.simd import LaneVar, Vec, keep, maximum

N = 4
ENTRIES = N * N


def rows(m: list) -> list[list]:
    """The 4 rows of a 4x4 matrix of lane values (row-major list of 16)."""
    return [m[N * j:N * j + N] for j in range(N)]


def transpose(m: list) -> list:
    """The transposed 4x4 matrix of lane values (no instruction: the lane values reordered)."""
    return [m[N * (i % N) + i // N] for i in range(ENTRIES)]


def sum4(values: list, flavor: str):
    """The fp32 sum of 4 lane values in the flavor's tree."""
    a0, a1, a2, a3 = values
    if flavor == "ascend":
        return keep((a0 + a1) + (a2 + a3))
    return keep(((a0 + a1) + a2) + a3)


def divide_by(values: list, den, flavor: str) -> list:
    """The flavor's fp32 quotients ``v / den`` of lane values (see the module docstring)."""
    if isinstance(den, Vec) or flavor != "ascend":
        return [keep(v / den) for v in values]
    den = keep(den)
    flushed_den = keep(F.flush_subnormal(den))
    return [F.ascend_quotient(v, den, flushed_den) for v in values]


def softmax_shift(logits: list) -> list:
    """The softmax's exp arguments ``x - rowmax``, per row, of 16 logits."""
    shifted = []
    for row in rows([keep(v) for v in logits]):
        peak = keep(maximum(maximum(row[0], row[1]), maximum(row[2], row[3])))
        shifted += [keep(x - peak) for x in row]
    return shifted


def softmax_of_exps(exps: list, flavor: str) -> list:
    """``e / rowsum(e)`` per row: the softmax, given the exps of ``softmax_shift``."""
    out = []
    for e in rows([keep(v) for v in exps]):
        out += divide_by(e, sum4(e, flavor), flavor)
    return out


def normalize_rows(m: list, eps, flavor: str) -> tuple[list, list]:
    """``(m / (rowsum + eps), the 4 denominators rowsum + eps)``."""
    dens = [keep(sum4(row, flavor) + eps) for row in rows(m)]
    return [q for row, den in zip(rows(m), dens, strict=True) for q in divide_by(row, den, flavor)], dens


def sinkhorn_of_exps(exps: list, repeat, eps, flavor: str, record=None) -> list:
    """The Sinkhorn projection of one token's 16 logits (lane values), as 16 lane values, given the
    exps of their ``softmax_shift``.

    Softmax over each row, ``+ eps``, then ``2 * repeat - 1`` sum normalisations ``x / (sum +
    eps)``, of the columns first, then alternately the rows and the columns. ``repeat`` (>= 1)
    may be a runtime value. ``record(step, matrix, denominators)``, when given, sees the softmax
    output as step 0 (denominators None), then every normalisation's input and denominators
    (steps 1 to ``2R - 1``), the matrix transposed for the column steps (odd ``step``) so that
    the normalised lines are its rows: the backward's replay (spec §3.9.3).
    """
    vector = isinstance(exps[0], Vec)
    p = softmax_of_exps(exps, flavor)
    if record is not None:
        record(0, p, None)
    # Every step normalises the rows of its input and hands the next step the transposed
    # quotients, so one loop body does both kinds; the first (a column step) takes the
    # transposed matrix, and after an odd number of steps the result is upright again.
    state = [LaneVar(vector, "float32", v) for v in transpose([keep(v + eps) for v in p])]
    with T.serial(2 * repeat - 1) as step:
        m = [keep(s.get()) for s in state]
        quotients, dens = normalize_rows(m, eps, flavor)
        if record is not None:
            record(step + 1, m, dens)
        for s, v in zip(state, transpose(quotients), strict=True):
            s.set(v)
    return [s.get() for s in state]
