"""ascend-sim: the model runs emitted AscendC faithfully, and reports a broken one.

The kernel under test (``sim_kernels.row_scale``) is lowered for ``ascend`` and run on the
simulator against torch, bit for bit (a max of |x| and one IEEE division per element),
under every pipe schedule, with token counts that give a partial tile, fewer work tiles
than the 64 simulated cores, and more than twice as many (every core wraps around its two
buffer versions). The negative controls break the emitted source on purpose, one rule at
a time, and check that every schedule reports each break as an error or as wrong data.
"""

import os

import pytest
import torch

from vmi_core.ascend_sim import (
    UB_BYTES_WITH_SIMT,
    AscendSimError,
    SimKernel,
    kernel_signature,
    launch_shape,
    prepare_source,
)
from vmi_core.compile import cache_dir
from vmi_core.tl.shell import DEFAULT_WORKERS
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.sim_kernels import COLUMNS, row_scale, row_scale_artifact, row_scale_reference

BLOCK_M = 16
CORES = DEFAULT_WORKERS["ascend"]
# One row; a partial tile; fewer tiles than cores; 129 tiles (three waves: each core's
# buffers wrap around); three full waves plus a partial tile.
ROWS = [1, 17, 1000, 2 * CORES * BLOCK_M + 5, 3 * CORES * BLOCK_M + 7]


def _inputs(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, COLUMNS, generator=generator(seed)) * 8


@pytest.mark.parametrize("schedule", SIM_SCHEDULES)
def test_matches_torch_under_every_schedule(schedule):
    for seed, rows in enumerate(ROWS):
        x = _inputs(rows, seed)
        with sim_schedule(schedule):
            y = row_scale(x, BLOCK_M, "ascend-sim")
        assert_bitwise_equal(y, row_scale_reference(x), f"rows={rows} schedule={schedule}")


def test_launch_shape_and_signature():
    artifact = row_scale_artifact(BLOCK_M)
    cores, ub_bytes = launch_shape(artifact.device_mod)
    assert cores == CORES
    # Two versions of the x and y tiles plus the row maxima, 32-byte aligned.
    assert ub_bytes == 4 * BLOCK_M * COLUMNS * 4 + 32 * ((BLOCK_M * 4 + 31) // 32)
    name, params = kernel_signature(artifact.kernel_source)
    assert name == "row_scale_kernel"
    assert [(p.name, p.ctype, p.is_pointer) for p in params] == [
        ("X", "float", True), ("Y", "float", True), ("M", "int32_t", False)]
    prepared = prepare_source(artifact.kernel_source)
    assert "__ubuf__" not in prepared and "__gm__" not in prepared and "tl_templates" not in prepared


def _sim_kernel(source: str, ub_bytes: int | None = None) -> SimKernel:
    from vmi_devkit.sim_kernels import build_row_scale

    artifact = row_scale_artifact(BLOCK_M)
    cores, ub = launch_shape(artifact.device_mod)
    return SimKernel(build_row_scale(BLOCK_M, "ascend"), source, cores, ub_bytes or ub, cache_dir() / "ascend-sim")


def _replace_once(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"expected exactly one {old!r} in the source"
    return source.replace(old, new)


LOAD_WAIT = "      asc_sync_wait(PIPE_MTE2, PIPE_V, static_cast<event_t>((x_version_counter_1 & 1)));\n"
REUSE_WAIT = "      asc_sync_wait(PIPE_V, PIPE_MTE2, static_cast<event_t>((x_version_counter_1 & 1)));\n"
LOAD_LENGTH = "1, (min(16, max((M - row0), 0)) * 256), 0, 0, 0,"
LOAD_DESTINATION = "((__ubuf__ float*)buf_dyn_shmem)[((x_version_counter_1 & 1) * 1024)]"
ROW_READ = "(((int32_t)threadIdx.x) * 64)) + j)]"
BARRIER = "  asc_syncthreads();\n"

# name -> how the emitted source is broken. Every one must be reported under every schedule.
MUTATIONS = {
    # read-after-write: the vector region may read the tile before its DMA lands
    "drop the wait for the load": lambda s: _replace_once(s, LOAD_WAIT, ""),
    # write-after-read: the next load may overwrite a tile the vector region still reads
    "drop the wait before reusing a buffer": lambda s: _replace_once(s, REUSE_WAIT, ""),
    "load burst one element short": lambda s: _replace_once(
        s, LOAD_LENGTH, "1, ((min(16, max((M - row0), 0)) * 256) - 4), 0, 0, 0,"),
    "load burst one element long": lambda s: _replace_once(
        s, LOAD_LENGTH, "1, ((min(16, max((M - row0), 0)) * 256) + 4), 0, 0, 0,"),
    "load into the other ping-pong buffer": lambda s: _replace_once(
        s, LOAD_DESTINATION, "((__ubuf__ float*)buf_dyn_shmem)[(((x_version_counter_1 + 1) & 1) * 1024)]"),
    "read one element past a tile row": lambda s: s.replace(ROW_READ, "(((int32_t)threadIdx.x) * 64)) + j + 1)]"),
    "drop the SIMT barrier": lambda s: _replace_once(s, BARRIER, ""),
    "SIMT barrier under a thread guard": lambda s: _replace_once(
        s, BARRIER, "  if (((int32_t)threadIdx.x) < 64) { asc_syncthreads(); }\n"),
}


# One mutation of each kind by default (a sync, a burst length, a tile bound, a barrier); each builds a
# simulator (seconds), so the others run in the slow run.
DEFAULT_MUTATIONS = ("drop the wait before reusing a buffer", "load burst one element long",
                     "read one element past a tile row", "SIMT barrier under a thread guard")


@pytest.mark.parametrize("mutation", [pytest.param(m, marks=[] if m in DEFAULT_MUTATIONS else [pytest.mark.slow])
                                      for m in MUTATIONS])
def test_negative_controls_are_reported(mutation):
    source = row_scale_artifact(BLOCK_M).kernel_source
    broken = MUTATIONS[mutation](source)
    assert broken != source
    kernel = _sim_kernel(broken)
    rows = ROWS[3]
    x = _inputs(rows, 7)
    for schedule in SIM_SCHEDULES:
        y = torch.full_like(x, float("nan"))
        with sim_schedule(schedule):
            try:
                kernel(x, y)
            except AscendSimError as error:
                assert "row_scale_kernel" in str(error) and "core" in str(error)
                continue
        assert not torch.equal(y, row_scale_reference(x)), f"{mutation!r} went unnoticed under {schedule}"


def test_a_simt_float_max_does_not_compile():
    # The arch-3510 SIMT API declares integer max/min only (the lane layer compares and selects floats).
    source = row_scale_artifact(BLOCK_M).kernel_source
    start = source.index("running = ((")
    broken = source[:start] + "running = max(running, 1.0f);" + source[source.index("\n", start):]
    with pytest.raises(AscendSimError, match="declares integer max only"):
        _sim_kernel(broken)


@pytest.mark.slow
def test_error_messages_name_what_broke():
    source = row_scale_artifact(BLOCK_M).kernel_source
    x = _inputs(ROWS[3], 1)
    y = torch.empty_like(x)
    x_bytes = x.numel() * 4
    no_load_notify = "asc_sync_notify(PIPE_MTE2, PIPE_V, static_cast<event_t>((x_version_counter_1 & 1)));"
    cases = [
        (MUTATIONS["load burst one element long"], "seq",
         rf"core 0 of 64: asc_copy_gm2ub_align\(.*\): GM bytes \[{x_bytes - 1280}, {x_bytes + 4}\) "
         rf"relative to tensor X of {x_bytes} bytes are out of bounds"),
        (MUTATIONS["SIMT barrier under a thread guard"], "seq", r"SIMT barrier divergence: 64 of 128 threads"),
        (MUTATIONS["drop the wait for the load"], "seq", r"MTE2->V event 0"),
        (lambda s: _replace_once(s, "  asc_sync_wait(PIPE_V, PIPE_MTE2, static_cast<event_t>(1));\n", ""), "seq",
         r"event V->MTE2 event 1 is still set at the end of the kernel"),
        (lambda s: s.replace(no_load_notify, ""), "seq", r"wait_flag MTE2->V event 0 can never be satisfied"),
        (lambda s: s.replace(no_load_notify, ""), "random",
         r"deadlock at the end of the kernel: pipe V waits at 'wait_flag MTE2->V event 0'"),
    ]
    for mutate, schedule, pattern in cases:
        with sim_schedule(schedule), pytest.raises(AscendSimError, match=pattern):
            _sim_kernel(mutate(source))(x, y)


def test_accesses_outside_the_ub_allocation_are_errors():
    source = row_scale_artifact(BLOCK_M).kernel_source
    x = _inputs(40, 2)
    with pytest.raises(AscendSimError, match=r"SIMT thread \d+: UB access: UB bytes \[.*\) outside the kernel's UB "
                                             r"allocation"):
        _sim_kernel(source.replace("+ 4096)] = running;", "+ 4096 + 1000)] = running;"))(x, torch.empty_like(x))


def test_a_ub_allocation_larger_than_the_core_has_is_an_error():
    x = _inputs(40, 3)
    with pytest.raises(AscendSimError, match=rf"exceeds the {UB_BYTES_WITH_SIMT} bytes of UB"):
        _sim_kernel(row_scale_artifact(BLOCK_M).kernel_source, ub_bytes=UB_BYTES_WITH_SIMT + 32)(x, torch.empty_like(x))


def test_an_unmodelled_intrinsic_does_not_compile():
    source = row_scale_artifact(BLOCK_M).kernel_source
    with pytest.raises(AscendSimError, match="does not compile against the model"):
        _sim_kernel(_replace_once(source, "  asc_init();\n", "  asc_init();\n  asc_set_ctrl(0);\n"))


def test_arguments_are_checked_like_a_kernel_call():
    kernel = _sim_kernel(row_scale_artifact(BLOCK_M).kernel_source)
    x = _inputs(40, 4)
    with pytest.raises(TypeError, match="argument X must be torch.float32"):
        kernel(x.double(), torch.empty_like(x))
    with pytest.raises(ValueError, match="the size of Y in dim 0 gives M = 39, but it is already 40"):
        kernel(x, torch.empty_like(x)[:39])
    with pytest.raises(ValueError, match="argument X has stride 128 in dim 0, expected 64"):
        kernel(torch.empty(40, 2 * COLUMNS)[:, :COLUMNS], torch.empty_like(x))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        kernel(x)


def test_unknown_schedule_is_rejected(monkeypatch):
    monkeypatch.setenv("VMI_ASCEND_SIM_SCHEDULE", "fastest")
    x = _inputs(4, 5)
    with pytest.raises(ValueError, match="VMI_ASCEND_SIM_SCHEDULE must be one of"):
        row_scale(x, BLOCK_M, "ascend-sim")


def test_sim_schedule_sets_a_schedule_for_its_block_and_none_keeps_the_current(monkeypatch):
    monkeypatch.setenv("VMI_ASCEND_SIM_SCHEDULE", "seq")
    with sim_schedule("producers_first"):
        assert os.environ["VMI_ASCEND_SIM_SCHEDULE"] == "producers_first"
        with sim_schedule(None):
            assert os.environ["VMI_ASCEND_SIM_SCHEDULE"] == "producers_first"
    assert os.environ["VMI_ASCEND_SIM_SCHEDULE"] == "seq"
    with pytest.raises(ValueError, match="schedule must be one of"), sim_schedule("fastest"):
        pass


def test_compiled_simulators_are_cached(tmp_path):
    source = row_scale_artifact(BLOCK_M).kernel_source
    from vmi_core.ascend_sim import compile_library

    first = compile_library(prepare_source(source), tmp_path)
    stamp = first.stat().st_mtime_ns
    assert compile_library(prepare_source(source), tmp_path) == first
    assert first.stat().st_mtime_ns == stamp
    # No scratch left beside the library (pch/: the model's precompiled headers).
    assert [path for path in tmp_path.iterdir() if path.name != "pch"] == [first]


@pytest.mark.slow
def test_a_corrupted_cached_simulator_is_rebuilt():
    source = row_scale_artifact(BLOCK_M).kernel_source + "// rebuilt after corruption\n"
    from vmi_core.ascend_sim import compile_library

    library = compile_library(prepare_source(source), cache_dir() / "ascend-sim")
    library.write_bytes(b"garbage" * 64)
    x = _inputs(40, 6)
    y = torch.empty_like(x)
    _sim_kernel(source)(x, y)
    assert_bitwise_equal(y, row_scale_reference(x))
