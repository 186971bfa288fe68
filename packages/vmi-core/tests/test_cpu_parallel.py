"""Row-parallel CPU execution (vmi_core.cpu_parallel)."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch

from vmi_core import cpu_parallel
from vmi_core.cpu_parallel import THREADS_ENV, cpu_threads, fold_rows, row_ranges, run_rows

ROWS = [0, 1, 2, 5, 7, 31, 32, 33, 100, 255, 256, 257, 511, 512, 600, 1000, 1023, 4097]
THREADS = [1, 2, 3, 4, 8, 16]
ALIGNS = [1, 2, 4, 32, 256]
MIN_ROWS = [0, 1, 2, 32, 128, 256]


def check_ranges(num_rows: int, threads: int, align: int, min_rows: int) -> None:
    ranges = row_ranges(num_rows, threads, align, min_rows)
    where = f"row_ranges({num_rows}, {threads}, {align}, {min_rows}) = {ranges}"
    assert 1 <= len(ranges) <= threads, where
    # Cover [0, num_rows) in order, without gaps or overlaps.
    assert ranges[0][0] == 0 and ranges[-1][1] == num_rows, where
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), where
    assert all(start <= stop for start, stop in ranges), where
    if num_rows:
        assert all(start < stop for start, stop in ranges), where
    # Boundaries on multiples of align (the end of the last range is num_rows).
    assert all(start % align == 0 for start, _ in ranges), where
    # No range shorter than min_rows unless it is the only one.
    if len(ranges) > 1:
        assert all(stop - start >= min_rows for start, stop in ranges), where


def test_row_ranges_properties():
    for case in itertools.product(ROWS, THREADS, ALIGNS, MIN_ROWS):
        check_ranges(*case)


def test_row_ranges_use_the_threads():
    assert row_ranges(4096, 4, 1, 256) == [(0, 1024), (1024, 2048), (2048, 3072), (3072, 4096)]
    assert row_ranges(4096, 4, 1, 2048) == [(0, 2048), (2048, 4096)]
    assert row_ranges(100, 8, 1, 256) == [(0, 100)]
    assert row_ranges(1000, 4, 32, 128) == [(0, 256), (256, 512), (512, 768), (768, 1000)]


def test_row_ranges_regressions():
    # A short last range is merged into the one before it.
    assert row_ranges(7, 3, 1, 2) == [(0, 3), (3, 7)]
    assert row_ranges(600, 2, 256, 256) == [(0, 600)]
    # No rows: one empty range (used to raise: a zero range step).
    assert row_ranges(0, 4, 1, 256) == [(0, 0)]
    assert row_ranges(0, 1, 32, 0) == [(0, 0)]


def test_cpu_threads_env(vmi_env):
    vmi_env.setenv(THREADS_ENV, "3")
    assert cpu_threads() == 3
    vmi_env.setenv(THREADS_ENV, "0")
    assert cpu_threads() == 1
    vmi_env.delenv(THREADS_ENV)
    assert cpu_threads() >= 1
    with pytest.raises(ValueError, match="VMI_CPU_THREADS must be an integer, got 'many'"):
        vmi_env.setenv(THREADS_ENV, "many")


@pytest.mark.parametrize("num_rows,align,min_rows", [(0, 1, 1), (5, 1, 256), (1000, 1, 100), (1000, 32, 64),
                                                     (4097, 128, 256)])
def test_run_rows_calls_every_range(vmi_env, num_rows, align, min_rows):
    vmi_env.setenv(THREADS_ENV, "4")
    calls = []
    lock = threading.Lock()

    def run(start, stop):
        with lock:
            calls.append((start, stop, threading.current_thread().name))

    run_rows(run, num_rows, align=align, min_rows=min_rows)
    expected = row_ranges(num_rows, 4, align, min_rows)
    assert sorted((start, stop) for start, stop, _ in calls) == expected
    if len(expected) == 1:  # a single range runs inline, on the caller's thread
        assert calls[0][2] == threading.current_thread().name


def test_run_rows_propagates_errors(vmi_env):
    vmi_env.setenv(THREADS_ENV, "4")

    def run(start, stop):
        if start > 0:
            raise RuntimeError(f"rows {start}:{stop}")

    with pytest.raises(RuntimeError, match="rows"):
        run_rows(run, 4096, min_rows=256)


def test_run_rows_writes_disjoint_rows(vmi_env):
    """Every row is written exactly once (the ranges a kernel gets are disjoint)."""
    vmi_env.setenv(THREADS_ENV, "8")
    counts = [0] * 3000

    def run(start, stop):
        for r in range(start, stop):
            counts[r] += 1

    run_rows(run, 3000, align=16, min_rows=64)
    assert counts == [1] * 3000
    assert cpu_parallel._pool is not None


def test_fold_rows_views_contiguous_rows_as_pieces():
    a = torch.arange(3 * 8).view(3, 8)
    b = torch.arange(3 * 4).view(3, 4)
    fa, fb = fold_rows(4, a, b)
    assert fa.shape == (12, 2) and fb.shape == (12, 1)
    assert fa.data_ptr() == a.data_ptr()  # a view: the kernel writes the caller's tensor
    assert torch.equal(fa.reshape(3, 8), a)


def test_fold_rows_refuses_what_does_not_split():
    a = torch.arange(3 * 8).view(3, 8)
    assert fold_rows(3, a) is None  # 8 columns do not split in 3
    assert fold_rows(2, a[:, :4]) is None  # strided rows
    assert fold_rows(2, a, a.t()) is None


@pytest.mark.parametrize("min_rows,expected", [(100, [(0, 100)]), (25, [(0, 25), (25, 50), (50, 75), (75, 100)])])
def test_launch_rows_honours_min_rows_on_cpu(vmi_env, min_rows, expected):
    vmi_env.setenv(THREADS_ENV, "4")
    calls = []
    lock = threading.Lock()

    def run(start, stop):
        with lock:
            calls.append((start, stop))

    cpu_parallel.launch_rows("cpu", run, 100, min_rows=min_rows)
    assert sorted(calls) == expected
    calls.clear()
    cpu_parallel.launch_rows("cuda", run, 100, min_rows=min_rows)
    assert calls == [(0, 100)]
