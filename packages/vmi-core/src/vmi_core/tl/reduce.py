"""Reduction operators, and TileLang's own row reducers.

``combine`` is the running step of ``Shell.segment_reduce`` and ``Shell.column_reduce``
(``vmi_core.tl.vector``, the portable forms). ``reduce_rows`` wraps ``T.reduce_*`` for
tiles whose shape the target's reducer accepts (Ascend SIMD: last axis, extent a
multiple of 64; CPU: local buffers).
"""

from __future__ import annotations

from .simd import maximum, minimum

REDUCE_OPS = ("max", "min", "sum")


def combine(op: str, acc, value):
    if op == "max":
        return maximum(acc, value)
    if op == "min":
        return minimum(acc, value)
    if op == "sum":
        return acc + value
    raise ValueError(f"reduction op must be one of {REDUCE_OPS}, got {op!r}")


def reduce_rows(shell, op: str, src, dst, *, clear: bool = True):
    """``dst[i] = op over the last axis of src[i, :]`` with the target's ``T.reduce_*``."""
    reducers = {"max": shell.T.reduce_max, "min": shell.T.reduce_min, "sum": shell.T.reduce_sum}
    if op not in reducers:
        raise ValueError(f"reduction op must be one of {REDUCE_OPS}, got {op!r}")
    return reducers[op](src, dst, dim=1, clear=clear)
