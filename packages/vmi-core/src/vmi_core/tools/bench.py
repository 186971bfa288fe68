"""Benchmark primitives of the ``vmi bench`` command: timing, thread counts, the machine's copy
bandwidth, row-chunked execution, and the ``Baseline`` of an op.

A baseline is the fastest straightforward torch composition of an op (what a competent PyTorch
user would write with native torch ops), so that a kernel is judged against real torch code
rather than against the bit-manipulating reference. Baselines are found through the
``vmi.baselines`` entry points (``discover_baselines``); the repository's development kit
(``shared/``, package ``vmi-devkit``) provides them, the released wheels do not.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

import torch
from torch.utils.benchmark import Timer

from ..environment import THREADS_ENV, refresh_environment

# Row chunks whose temporaries stay in cache: the chunk the baselines try besides the whole tensor.
CHUNK_ROWS = 128
COPY_BYTES = 256 << 20
# Seconds of calls per measurement (torch.utils.benchmark's blocked_autorange): blocks of calls
# until this much time is spent, each block long enough that reading the clock costs nothing.
MIN_RUN_TIME = 0.2
BASELINE_GROUP = "vmi.baselines"


@dataclass(frozen=True)
class Baseline:
    """An op's baseline for one set of options.

    ``run(inputs, flavor, rows)`` -> outputs in the structure of the op's ``run`` (so the op's
    ``check`` compares them with the reference), computed over ``rows``-row chunks (``None``:
    the whole tensor at once). ``what`` says in a few words what it is; ``same_bits`` claims that
    its outputs pass the op's ``check`` against the reference (bit for bit, or the op's stated
    tolerance) on the op's inputs; a test holds the claim; ``is_reference``
    marks the fallback that runs the reference itself; ``chunks`` is False when ``rows`` is
    ignored (the op's result depends on more than one chunk's rows).
    """

    run: Callable
    what: str
    same_bits: bool = True
    is_reference: bool = False
    chunks: bool = True


def discover_baselines() -> dict[str, Callable]:
    """The installed baselines by op name: ``baseline(op, options)`` -> ``Baseline`` for an ``OpInfo``.

    Each entry point of the ``vmi.baselines`` group names a module whose ``BASELINES`` dict maps op
    names (not aliases) to such functions.
    """
    found: dict[str, Callable] = {}
    for ep in entry_points(group=BASELINE_GROUP):
        found.update(ep.load().BASELINES)
    return found


def chunked_reference(reference: Callable, slice_inputs: Callable | None, num_rows: Callable | None,
                      reason: str) -> Baseline:
    """The fallback baseline: ``reference(inputs, flavor)`` over row chunks.

    ``slice_inputs(inputs, start, stop)`` gives the inputs of rows ``[start, stop)``;
    ``num_rows(inputs)`` the number of rows (both ``None``: the reference cannot be run in
    chunks, it runs whole); ``reason`` says why torch ops are not used.
    """
    if slice_inputs is None:
        return Baseline(lambda inputs, flavor, rows: reference(inputs, flavor),
                        f"the reference, whole ({reason})", is_reference=True, chunks=False)

    def run(inputs, flavor, rows):
        return in_row_chunks(lambda start, stop: reference(slice_inputs(inputs, start, stop), flavor),
                             num_rows(inputs), rows)
    return Baseline(run, f"the reference in row chunks ({reason})", is_reference=True)


def _as_tuple(outputs) -> tuple[tuple, bool]:
    if isinstance(outputs, torch.Tensor):
        return (outputs,), True
    return tuple(outputs), False


def in_row_chunks(fn: Callable, num_rows: int, rows: int | None):
    """``fn(start, stop)`` (a tensor or a tuple of tensors for rows ``[start, stop)``) over chunks of
    ``rows`` rows (``None``: one call over all rows), assembled into full outputs.

    Each output's first dimension is taken to scale with the rows (a per-row output, or a per-block
    one like an SF grid with ``rows`` a multiple of the block): the outputs are allocated once from
    the first chunk and every chunk is copied into place while it is still in cache.
    """
    if rows is None or rows >= num_rows:
        return fn(0, num_rows)
    first, single = _as_tuple(fn(0, rows))
    outs = []
    for t in first:
        total = -(-num_rows * t.shape[0] // rows)
        out = torch.empty((total, *t.shape[1:]), dtype=t.dtype, device=t.device)
        out[:t.shape[0]].copy_(t)
        outs.append(out)
    offsets = [t.shape[0] for t in first]
    for start in range(rows, num_rows, rows):
        chunk, _ = _as_tuple(fn(start, min(start + rows, num_rows)))
        for i, t in enumerate(chunk):
            outs[i][offsets[i]:offsets[i] + t.shape[0]].copy_(t)
            offsets[i] += t.shape[0]
    for out, offset in zip(outs, offsets, strict=True):
        if offset != out.shape[0]:
            raise ValueError(f"in_row_chunks: an output's rows do not scale with the input rows "
                             f"({offset} written of {out.shape[0]})")
    return outs[0] if single else tuple(outs)


@dataclass(frozen=True)
class Timing:
    """``fn()``'s result (of the warm-up call) and its seconds per call: the median over blocks of
    calls, their interquartile range, and how many calls were timed."""

    result: object
    median: float
    iqr: float
    calls: int


def measure(fn: Callable, min_run_time: float = MIN_RUN_TIME) -> Timing:
    """``fn`` timed by ``torch.utils.benchmark``'s blocked autorange, with the current torch thread
    count, after one warm-up call: at least ``min_run_time`` seconds of calls (and at least one
    block: a slow ``fn`` runs once more after its warm-up, and once to size the block)."""
    result = fn()
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(result, measurement.median, measurement.iqr, measurement.number_per_run * len(measurement.times))


@contextlib.contextmanager
def threads(n: int):
    """Run the block with ``n`` torch threads and ``n`` vmi cpu-kernel threads (``VMI_CPU_THREADS``)."""
    saved_torch, saved_env = torch.get_num_threads(), os.environ.get(THREADS_ENV)
    torch.set_num_threads(n)
    os.environ[THREADS_ENV] = str(n)
    refresh_environment()
    try:
        yield
    finally:
        torch.set_num_threads(saved_torch)
        if saved_env is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = saved_env
        refresh_environment()


def copy_bandwidth(nbytes: int = COPY_BYTES, min_run_time: float = MIN_RUN_TIME) -> float:
    """Bytes per second of ``dst.copy_(src)`` of an ``nbytes`` uint8 buffer (bytes read + written),
    timed as ``measure`` times, with the current torch thread count."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * nbytes / measure(lambda: dst.copy_(src), min_run_time).median
