"""Benchmark primitives (vmi_core.tools.bench)."""

from __future__ import annotations

import os

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, cpu_threads
from vmi_core.tools.bench import copy_bandwidth, in_row_chunks, measure, threads


@pytest.mark.parametrize("rows", [None, 4, 32, 128, 1000])
def test_in_row_chunks_assembles_per_row_and_per_block_outputs(rows):
    x = torch.arange(300 * 4, dtype=torch.float32).view(300, 4)
    calls = []

    def fn(start, stop):
        calls.append((start, stop))
        # A per-row output and a per-block one: the sums of blocks of 4 rows.
        return x[start:stop] * 2, x[start:stop].view(-1, 4, 4).sum(dim=(1, 2))

    per_row, per_block = in_row_chunks(fn, 300, rows)
    assert torch.equal(per_row, x * 2)
    assert torch.equal(per_block, x.view(75, 4, 4).sum(dim=(1, 2)))
    step = 300 if rows is None else min(rows, 300)
    assert calls == [(a, min(a + step, 300)) for a in range(0, 300, step)]


def test_in_row_chunks_single_tensor_with_a_short_tail():
    x = torch.randn(130, 3)
    assert torch.equal(in_row_chunks(lambda a, b: x[a:b] + 1, 130, 128), x + 1)


def test_threads_sets_and_restores_torch_and_kernel_threads():
    saved_torch, saved_env = torch.get_num_threads(), os.environ.get(THREADS_ENV)
    with threads(1):
        assert torch.get_num_threads() == 1 and cpu_threads() == 1
    assert torch.get_num_threads() == saved_torch and os.environ.get(THREADS_ENV) == saved_env


def test_measure_keeps_the_warm_up_result_and_times_blocks_of_calls():
    calls = []
    timing = measure(lambda: calls.append(1) or len(calls), min_run_time=0.01)
    assert timing.result == 1 and len(calls) > timing.calls >= 1
    assert timing.median > 0 and timing.iqr >= 0


def test_copy_bandwidth_is_positive():
    assert copy_bandwidth(1 << 20, min_run_time=0.01) > 0
