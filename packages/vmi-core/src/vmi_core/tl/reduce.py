"""Reductions that lower on every target.

``segment_reduce`` is the portable form: one lane per (row, segment) keeps an
accumulator and walks its segment serially; it runs on CPU, CUDA and Ascend SIMT.
``reduce_rows`` wraps ``T.reduce_*`` for tiles whose shape the target's reducer
accepts (Ascend SIMD: last axis, extent a multiple of 64; CPU: local buffers).
"""

from __future__ import annotations

import tilelang.language as T

REDUCE_OPS = ("max", "min", "sum")


def combine(op: str, acc, value):
    if op == "max":
        return T.max(acc, value)
    if op == "min":
        return T.min(acc, value)
    if op == "sum":
        return acc + value
    raise ValueError(f"reduction op must be one of {REDUCE_OPS}, got {op!r}")


@T.macro
def segment_reduce(acc, rows: int, segments: int, seg_len: int, value, op: str, init):
    """``acc[i, s] = op over j < seg_len of value(i, s * seg_len + j)``, one lane per ``(i, s)``.

    ``value(i, col)`` is a Python function returning the element expression; it may
    guard columns past a partial last segment itself. The running value stays in a
    per-lane scalar and ``acc`` is stored once: a read-modify-write of the tile in the
    loop would make TileLang put a barrier inside the loop, which lanes past the last
    ``(i, s)`` never reach.
    """
    for i, s in T.Parallel(rows, segments):
        running = T.alloc_var(acc.dtype)
        running = init
        for j in T.serial(seg_len):
            running = combine(op, running, value(i, s * seg_len + j))
        acc[i, s] = running


def reduce_rows(shell, op: str, src, dst, *, clear: bool = True):
    """``dst[i] = op over the last axis of src[i, :]`` with the target's ``T.reduce_*``."""
    reducers = {"max": shell.T.reduce_max, "min": shell.T.reduce_min, "sum": shell.T.reduce_sum}
    if op not in reducers:
        raise ValueError(f"reduction op must be one of {REDUCE_OPS}, got {op!r}")
    return reducers[op](src, dst, dim=1, clear=clear)
