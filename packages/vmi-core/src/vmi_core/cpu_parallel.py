"""Row-parallel execution of CPU kernels.

TileLang's C backend emits single-threaded code, but its ctypes call releases the
GIL: a kernel with a runtime row count can be run from several Python threads on
disjoint row ranges. Rows split at multiples of ``align`` so tiles (and packed
SF words along M) never straddle two ranges. The thread count is ``$VMI_CPU_THREADS`` (default
all cores), read once (``vmi_core.environment``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .cpu_kernel import LAUNCH_RECORDER
from .environment import THREADS_ENV as THREADS_ENV
from .environment import environment

# Fewer rows than this per thread cost more in hand-off than they gain (a few microseconds each).
MIN_ROWS_PER_THREAD = 32
_pool: ThreadPoolExecutor | None = None


def cpu_threads() -> int:
    return environment().cpu_threads


def row_ranges(num_rows: int, threads: int, align: int, min_rows: int) -> list[tuple[int, int]]:
    """At most ``threads`` ranges of ``align``-multiple size covering ``[0, num_rows)``, none
    shorter than ``min_rows`` unless it is the only one."""
    chunks = max(1, min(threads, num_rows // max(min_rows, 1)))
    step = -(-num_rows // chunks)
    step = max(1, -(-step // align) * align)
    ranges = [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)] or [(0, 0)]
    # Only the last range can fall short of min_rows (the others have step >= num_rows / chunks
    # >= min_rows rows): merge it into the one before.
    if len(ranges) > 1 and ranges[-1][1] - ranges[-1][0] < min_rows:
        ranges[-2:] = [(ranges[-2][0], num_rows)]
    return ranges


def run_concurrently(calls: list[Callable[[], object]]) -> None:
    """Each of ``calls``, on the pool's threads, until all have returned."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(cpu_threads(), thread_name_prefix="vmi-cpu")
    for future in [_pool.submit(call) for call in calls]:
        future.result()


def run_rows(run: Callable[[int, int], None], num_rows: int, *, align: int = 1,
             min_rows: int = MIN_ROWS_PER_THREAD) -> None:
    """Call ``run(start, stop)`` over row ranges, concurrently when there is more than one."""
    ranges = row_ranges(num_rows, cpu_threads(), align, min_rows)
    recorder = LAUNCH_RECORDER.get()
    if recorder is not None:
        recorder.ranges(run, ranges)
    elif len(ranges) == 1:
        run(*ranges[0])
    else:
        run_concurrently([lambda start=start, stop=stop: run(start, stop) for start, stop in ranges])


def launch_rows(target: str, run: Callable[[int, int], None], num_rows: int, *, align: int = 1,
                min_rows: int = MIN_ROWS_PER_THREAD) -> None:
    """``run(start, stop)`` over all rows: split across threads on ``cpu`` (``run_rows``), one call elsewhere."""
    if target == "cpu":
        run_rows(run, num_rows, align=align, min_rows=min_rows)
    else:
        run(0, num_rows)


def fold_rows(pieces: int, *matrices):
    """Each contiguous ``(rows, cols)`` matrix viewed as ``(rows * pieces, cols // pieces)``, or None
    when one is not contiguous or its rows do not split into ``pieces`` equal parts.

    For row-wise ops whose rows split into independent segments: a few long rows become many
    short ones, so a kernel with tall tiles (a decode-size call) computes no padding rows.
    """
    folded = []
    for matrix in matrices:
        if not matrix.is_contiguous() or matrix.dim() != 2 or matrix.shape[1] % pieces:
            return None
        folded.append(matrix.view(matrix.shape[0] * pieces, matrix.shape[1] // pieces))
    return folded
