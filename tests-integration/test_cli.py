"""The ``vmi`` command end to end: as a user runs it (a subprocess) for ``list`` and one ``run``; the
rest through the command's ``main`` in process, which parses, prints and exits the same way
without an interpreter start (and a torch and TileLang import) per call."""

from __future__ import annotations

import subprocess
import sys

import pytest


def vmi(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmi_core.tools.cli", *args], capture_output=True, text=True,
                          timeout=600)


def in_process(capsys, *args: str) -> tuple[int, str, str]:
    """The command's exit status, stdout and stderr, run through its ``main``."""
    from vmi_core.tools.cli import main

    try:
        status = main(list(args))
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def test_version_names_every_installed_distribution_on_one_line(capsys):
    from importlib.metadata import version

    status, out, _ = in_process(capsys, "--version")
    assert status == 0
    assert out == ", ".join(f"{name} {version(name)}" for name in ("vmi-core", "vmi-quant", "vmi-mhc", "vmi-moe",
                                                                   "torch", "tilelang")) + "\n"


def test_a_reader_that_went_away_gets_no_traceback():
    """``vmi list | head -1``: output into a pipe nobody reads (its read end closed before the
    command writes) ends the command quietly."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "vmi_core.tools.cli", "list"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=600)
    finally:
        os.close(write_end)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr


def test_list_shows_installed_ops_per_target():
    result = vmi("list")
    assert result.returncode == 0, result.stderr
    assert "per_token_cast" in result.stdout
    for target in ("ascend", "cuda", "cpu"):
        assert target in result.stdout


def test_list_compact_and_json_name_the_same_ops(capsys):
    import json

    from vmi_core.tools.registry import discover

    names = sorted({op.name for op in discover().values()})
    status, out, _ = in_process(capsys, "list", "--compact")
    assert status == 0 and sorted(line.split()[0] for line in out.splitlines()) == names
    status, out, _ = in_process(capsys, "list", "--json")
    listed = json.loads(out)
    assert status == 0 and sorted(op["name"] for op in listed) == names
    assert all(set(op["targets"]) == {"ascend", "cuda", "cpu", "ascend-sim"} and op["family"] for op in listed)


def test_run_checks_against_the_reference():
    result = vmi("run", "per_token_cast", "--shape", "64x256", "--min-time", "0.01")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "matches the reference bit for bit" in result.stdout
    assert "bit-exact torch reference" in result.stdout and "speed-up" not in result.stdout


def test_run_with_options_checks_against_the_reference(capsys):
    status, out, err = in_process(capsys, "run", "per_token_cast", "--shape", "64x256", "--min-time", "0.01",
                                  "-o", "fmt=e2m1", "-o", "round_sf=true", "-o", "use_packed_ue8m0=true")
    assert status == 0, out + err
    assert "matches the reference bit for bit" in out and "median of" in out and "(one call;" in out


def test_bench_prints_kernel_reference_baseline_and_copy_bandwidth(capsys):
    status, out, err = in_process(capsys, "bench", "per_token_cast", "--shape", "256x512", "--min-time", "0.01",
                                  "--threads", "1")
    assert status == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith("per_token_cast (cpu, 1 thread, flavor ascend) options: fmt=e4m3")
    assert "copy bandwidth" in lines[1] and "GB/s" in lines[1]
    assert lines[2].startswith("  baseline: torch ops")
    header, row = lines[3], lines[4]
    for column in ("kernel", "reference", "baseline", "baseline run", "vs ref", "vs baseline", "% copy"):
        assert column in header, header
    assert row.split()[0] == "256x512" and row.count("GB/s") == 3 and "MISMATCH" not in row
    # 256 rows: the whole tensor and 128-row chunks are tried, the faster named; E4M3 by torch gives the same bits.
    assert ("whole, same" in row or "chunked 128, same" in row) and row.rstrip().endswith("%"), row
    assert not any(line.startswith("per_token_cast (cpu, 2 threads") for line in lines)


def test_bench_overhead_splits_a_call_into_its_layers(capsys):
    status, out, err = in_process(capsys, "bench", "normalize_weight", "--overhead", "--tokens", "1,4")
    assert status == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith("normalize_weight (cpu, 1 thread, flavor ascend)")
    assert lines[1].split() == ["shape", "call", "types", "dispatcher", "plan", "kernels", "overhead", "unplanned",
                                "launches", "planned"]
    for line, shape in zip(lines[2:4], ("1x8", "4x8"), strict=True):
        cells = line.split()
        assert cells[0] == shape and cells[2:16:2] == ["us"] * 7 and cells[-2:] == ["1", "yes"], line
    assert lines[4].startswith("us per call, best of 5 batches")


def test_bench_decode_sizes_in_microseconds_per_thread_count(capsys):
    """In process (no interpreter start): a decode size, both thread counts."""
    from vmi_core.tools.cli import main

    assert main(["bench", "topk_gate", "--shape", "4x256", "--min-time", "0.01", "--threads", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "(cpu, 1 thread," in out and "(cpu, 2 threads," in out
    rows = [line for line in out.splitlines() if line.split()[:1] == ["4x256"]]
    assert len(rows) == 2
    for row in rows:
        assert row.count(" us") == 3 and "whole, same" in row, row
    assert out.count("vs ref  vs baseline") == 2 and "Ratios: the other's time / the kernel's (> 1" in out


def test_bench_without_baselines_times_kernel_and_reference(capsys, monkeypatch):
    """As from an installed wheel, without vmi-devkit's baselines."""
    from vmi_core.tools import bench
    from vmi_core.tools.cli import main

    monkeypatch.setattr(bench, "discover_baselines", dict)
    assert main(["bench", "cast", "--shape", "256x512", "--min-time", "0.01", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("  baseline: none installed")
    # kernel and reference timed; baseline, its run and "vs baseline" shown as "-"; vs ref and % copy.
    row = lines[4].split()
    assert row[0] == "256x512" and lines[4].count("GB/s") == 2, lines[4]
    assert row[-5:-3] == ["-", "-"] and row[-2] == "-" and row[-1].endswith("%"), lines[4]


def test_source_for_each_target(capsys):
    status, ascend, err = in_process(capsys, "source", "per_token_cast", "--target", "ascend")
    assert status == 0, err
    assert "__simd_vf__" in ascend and "__simt_vf__" in ascend
    assert "asc_copy_gm2ub_align" in ascend
    assert ascend.startswith("// vmi source: per_token_cast, kernel 1 of 1: per_token_cast; target ascend")
    status, cuda, err = in_process(capsys, "source", "per_token_cast", "--target", "cuda", "-o", "fmt=e2m1")
    assert status == 0, err
    assert "__global__" in cuda


def test_source_prints_every_kernel_of_an_op(capsys):
    status, out, err = in_process(capsys, "source", "mhc_pre_norm_fn_gemm_fwd", "--target", "cpu")
    assert status == 0, err
    headers = [line for line in out.splitlines() if line.startswith("// vmi source:")]
    assert [h.split(": ")[2].split(";")[0] for h in headers] == ["tf32_split", "gemm_fwd"], headers


def test_source_stats_count_one_ascend_sim_launch(capsys):
    # cast fp32 -> bf16: one 64-lane iteration per 64 elements, DMA 4 bytes in and 2 out per element.
    status, out, err = in_process(capsys, "source", "cast", "--target", "ascend", "--stats", "--shape", "64x256")
    assert status == 0, out + err
    assert "simd region" in out and "16384 elements" in out
    assert "dma gm to ub bytes: 65536 (4.000 per element)" in out
    assert "dma ub to gm bytes: 32768 (2.000 per element)" in out
    assert "vector loads: 256 (0.016 per element)" in out and "simt ub accesses: 0 " in out
    status, _, err = in_process(capsys, "source", "cast", "--target", "cuda", "--stats")
    assert status == 2 and "--stats" in err


def test_bad_option_is_a_clear_error(capsys):
    status, _, err = in_process(capsys, "run", "per_token_cast", "-o", "num_per_channels=48")
    assert status == 2 and "num_per_channels" in err


@pytest.mark.parametrize(("args", "names"), [
    (["run", "no_such_op"], "unknown op 'no_such_op'; `vmi list` shows the installed ops"),
    (["run", "per_token_cst"], "unknown op 'per_token_cst'; did you mean per_token_cast"),
    (["run", "per_token_cast", "-o", "num_per_channels=abc"], "option num_per_channels takes an integer, got 'abc'"),
    (["run", "per_token_cast", "-o", "no_such_option=1"], "has no option 'no_such_option'"),
    (["run", "per_token_cast", "--min-time", "0"], "argument --min-time: must be a positive number of seconds, got 0"),
    (["bench", "per_token_cast", "--min-time", "x"], "argument --min-time: must be a positive number of seconds"),
    (["bench", "per_token_cast", "--threads", "1,x"], "argument --threads: must be positive integers"),
    (["run", "per_token_cast", "--shape", "64"], "--shape: per_token_cast takes a 2-D shape"),
    (["run", "per_token_cast", "--shape", "4x-64"], "argument --shape: shape sizes must not be negative"),
    (["run", "per_block_cast", "--shape", "3x5"], "multiples of 128"),
    (["run", "per_token_cast", "--target", "cuda"], "target 'cuda' needs a CUDA GPU"),
    (["run", "per_token_cast", "--target", "ascend"], "target 'ascend' needs an Ascend NPU"),
    (["run", "mhc_sinkhorn_fwd", "--target", "ascend-sim", "--flavor", "cuda"],
     "flavor 'cuda' is not available on target 'ascend-sim'"),
    (["source", "normalize_weight", "--target", "cuda", "--flavor", "ascend"],
     "flavor 'ascend' is not available on target 'cuda'"),
])
def test_user_errors_are_one_line_with_exit_status_2(args, names, capsys):
    """In process (the command's main), so that the many cases cost no interpreter start each."""
    import torch

    from vmi_core.tools.cli import main

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this host has a CUDA GPU, so --target cuda is not an error here")
    try:
        status = main(args)
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], err


def test_debug_shows_the_traceback_of_a_user_error(capsys):
    from vmi_core.tools.cli import main

    with pytest.raises(ValueError, match="option num_per_channels must be one of"):
        main(["--debug", "run", "per_token_cast", "-o", "num_per_channels=48"])


def test_run_on_ascend_sim(capsys):
    status, out, err = in_process(capsys, "run", "per_token_cast", "--target", "ascend-sim", "--shape", "40x256",
                                  "--min-time", "0.01")
    assert status == 0, out + err
    assert "target=ascend-sim" in out and "matches the reference bit for bit" in out
    status, out, _ = in_process(capsys, "list")
    assert status == 0 and "ascend-sim" in out


def test_a_target_with_its_own_flavor_is_checked_against_that_flavor(capsys):
    """ascend-sim runs the ascend flavor (naming it is allowed, another is an error above); the
    reference must use it too."""
    from vmi_core.tools.cli import main

    assert main(["run", "normalize_weight", "--target", "ascend-sim", "--flavor", "ascend", "--shape", "300x8",
                 "--min-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "target=ascend-sim flavor=ascend" in out and "matches the reference bit for bit" in out


def test_demo_finds_demos_through_their_entry_point_group(monkeypatch, capsys):
    """``vmi demo [NAME] [options]``: the demo's own options reach it; vmi-core imports no demo."""
    from importlib.metadata import EntryPoint

    from vmi_core.tools import cli

    calls = []
    module = type(sys)("vmi_fake_demo")
    module.main = lambda argv: calls.append(argv) or 0
    monkeypatch.setitem(sys.modules, "vmi_fake_demo", module)
    block = EntryPoint("block", "vmi_fake_demo:main", cli.DEMO_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [block] if group == cli.DEMO_GROUP else [])
    assert cli.main(["demo", "--ep", "2"]) == 0
    assert cli.main(["demo", "block", "--seed", "3"]) == 0
    assert calls == [["--ep", "2"], ["--seed", "3"]]
    assert cli.main(["demo", "other"]) == 2
    assert "no demo named 'other'; installed: block" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["list", "--ep", "2"])
    assert "unrecognized arguments: --ep 2" in capsys.readouterr().err


def test_the_meta_package_declares_the_block_demo():
    """The meta-package's ``vmi.demos`` entry point names a callable (installed by scripts/setup)."""
    from importlib import import_module
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    with open(Path(__file__).resolve().parents[1] / "packages" / "vmi" / "pyproject.toml", "rb") as f:
        demos = tomllib.load(f)["project"]["entry-points"]["vmi.demos"]
    module, name = demos["block"].split(":")
    assert callable(getattr(import_module(module), name))
