"""One prepared run on an Ascend 950 host: calibrate the simulator, test every family, benchmark every op.

    python -m vmi_devkit.npu_check [--target ascend|ascend-sim] [--out DIR] [--quick] [--stages S,...]

``scripts/npu-check`` runs it from a checkout (its header says what the host needs). Stages, in
this order (``--stages``, default all):

* ``calibrate``: every kernel of ``vmi_devkit.calibration``, each compared bit for bit with its
  reference; per kernel the rows of the ascend-sim assumption table (vmi-core README) it settles,
  and either "agrees" or the first element of each result that differs (or why it did not run).
* ``tests``: one pytest run over the three families' tests with ``--target T`` and ``-m "not slow"``
  (``--tests-k`` selects by keyword), counted per family from its JUnit XML.
* ``bench``: ``vmi_core.tools.devicecheck`` on the target (every op against its reference at a
  covering set of options and three shapes, then timed at its bench shapes against the device's
  copy bandwidth), then on ``ascend`` the torch_npu fused ops that do what a vmi op does
  (``vmi_devkit.npu_counterparts``), timed the same way at the same shapes.

On ``ascend-sim`` the same stages run on the CPU against vmi-core's model (the calibrations then
report the model's own answers): that is how this script is tested without an NPU. Writes
``report.md`` and ``report.json`` to ``--out`` after each stage; exits 1 if a calibration disagrees
or fails, a test fails, or the device check reports a failure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # shared/src/vmi_devkit -> the checkout
FAMILIES = ("quant", "mhc", "moe")
STAGES = ("calibrate", "tests", "bench")
_t0 = time.monotonic()


def log(message: str) -> None:
    print(f"npu-check: {datetime.datetime.now():%H:%M:%S} [{time.monotonic() - _t0:6.1f}s] {message}", flush=True)


# --- calibrate ------------------------------------------------------------------------------------

def calibrate_all(target: str, names: list[str]) -> list[dict]:
    from .calibration import calibrate

    results = []
    for name in names:
        result = calibrate(name, target)
        verdict = ("agrees" if result.agrees else f"fails to run: {result.error}" if result.error
                   else f"disagrees on {', '.join(result.disagreements)}")
        log(f"calibration {name:<17} ({len(result.checked)} results): {verdict}")
        results.append(asdict(result))
    return results


# --- tests ----------------------------------------------------------------------------------------

def run_tests(target: str, out: Path, families: list[str], jobs: int, keyword: str | None) -> dict:
    """pytest over the families' tests on ``target``; per family the outcome counts and the failures."""
    junit = out / "tests.xml"
    command = [sys.executable, "-m", "pytest", *(f"packages/vmi-{f}/tests" for f in families), "--target", target,
               "-m", "not slow", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if jobs > 1:
        command += ["-n", str(jobs)]
    if keyword:
        command += ["-k", keyword]
    log("tests: " + _shown(command))
    started = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    (out / "tests.log").write_text(proc.stdout + proc.stderr)
    summary = {"command": _shown(command), "returncode": proc.returncode,
               "seconds": round(time.monotonic() - started, 1), "families": {}}
    if not junit.exists():
        summary["error"] = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["pytest wrote no report"]
        return summary
    for case in ET.parse(junit).getroot().iter("testcase"):
        family = re.search(r"vmi-(\w+)", case.get("file", "") + case.get("classname", ""))
        counts = summary["families"].setdefault(family.group(1) if family else "other",
                                                {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []})
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), None)
        key = {"failure": "failed", "error": "errors", "skipped": "skipped"}.get(outcome, "passed")
        counts[key] += 1
        if key in ("failed", "errors"):
            message = next(child for child in case if child.tag == outcome).get("message", "")
            counts["failures"].append(f"{case.get('classname')}::{case.get('name')}: {message[:300]}")
    for family, counts in summary["families"].items():
        log(f"tests vmi-{family}: {counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
            f"{counts['skipped']} skipped")
    return summary


# --- bench ----------------------------------------------------------------------------------------

def run_devicecheck(target: str, out: Path, args) -> dict:
    """``vmi_core.tools.devicecheck`` on ``target``, in a process of its own; its report.json."""
    where = out / "devicecheck"
    command = [sys.executable, "-m", "vmi_core.tools.devicecheck", "--target", target, "--out", str(where),
               "--jobs", str(args.jobs), "--budget", str(args.bench_budget), "--repeat", str(args.repeat)]
    if args.quick:
        command.append("--quick")
    if args.ops:
        command += ["--ops", args.ops]
    log("bench: " + _shown(command))
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    (out / "devicecheck.log").write_text(proc.stdout + proc.stderr)
    report = json.loads((where / "report.json").read_text()) if (where / "report.json").exists() else {}
    return {"command": _shown(command), "returncode": proc.returncode, "report": report}


def _shown(command: list[str]) -> str:
    return shlex.join(["python", *command[1:]])


def run_counterparts(target: str, ops: list[str] | None, quick: bool, repeat: int) -> list[dict]:
    """The torch_npu fused ops of ``npu_counterparts`` at each vmi op's bench shapes (``ascend`` only)."""
    if target != "ascend":
        return []
    from .npu_counterparts import time_counterparts

    rows = time_counterparts(ops, quick, repeat)
    for row in rows:
        timing = f"{row['us']:.1f} us, {row['gbs']:.1f} GB/s" if "us" in row else row["error"]
        log(f"torch_npu {row['counterpart']} for {row['op']} at {row['shape']}: {timing}")
    return rows


# --- report ---------------------------------------------------------------------------------------

def environment(target: str, jobs: int) -> dict:
    """The device check's environment (versions; on ``ascend`` the NPU, torch_npu and CANN), with the
    date and the checkout's commit."""
    from vmi_core.tools.devicecheck import environment as device_environment

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {**device_environment(target, jobs), "date": datetime.date.today().isoformat(), "commit": commit}


def _agrees(calibration: dict) -> bool:
    return calibration["error"] is None and not calibration["disagreements"]


def failed(report: dict) -> bool:
    bad = not all(_agrees(r) for r in report.get("calibrations", []))
    tests = report.get("tests")
    bad = bad or bool(tests and (tests["returncode"] not in (0, 5) or "error" in tests))
    bench = report.get("bench")
    return bad or bool(bench and bench["returncode"] != 0)


def markdown(report: dict) -> str:
    env = report["environment"]
    out = [f"# vmi npu-check: target {env['target']}", "", *(f"- {k}: {v}" for k, v in env.items() if v),
           f"- elapsed: {report['elapsed_s']:.0f} s", f"- result: {'FAIL' if failed(report) else 'pass'}", ""]
    if "calibrations" in report:
        out += ["## Calibration", "",
                "Each kernel's results bit for bit against `vmi_devkit.calibration.references` (the documented "
                "semantics and the model's assumptions). A disagreement on `ascend` settles the rows it names "
                "against the model: change the model and its row in vmi-core's README.", "",
                "| calibration | assumption rows it settles | results | verdict |", "| --- | --- | --- | --- |"]
        for r in report["calibrations"]:
            verdict = ("agrees" if _agrees(r) else
                       f"did not run: {r['error']}" if r["error"] else
                       "<br>".join(f"`{k}`: {v}" for k, v in r["disagreements"].items()))
            out.append(f"| {r['name']} | {'; '.join(r['rows'])} | {len(r['checked'])} | {verdict.replace('|', '/')} |")
        out.append("")
    if "tests" in report:
        tests = report["tests"]
        out += ["## Family tests", "",
                f"`{tests['command']}` (exit status {tests['returncode']}, {tests['seconds']} s)", ""]
        out += ["| family | passed | failed | errors | skipped |", "| --- | --- | --- | --- | --- |"]
        for family, c in tests["families"].items():
            out.append(f"| vmi-{family} | {c['passed']} | {c['failed']} | {c['errors']} | {c['skipped']} |")
        for counts in tests["families"].values():
            out += [f"- {line}" for line in counts["failures"][:20]]
        if "error" in tests:
            out.append(f"- pytest: {tests['error']}")
        out.append("")
    if "bench" in report:
        from vmi_core.tools.devicecheck import summary_table

        bench = report["bench"]
        out += ["## Ops: correctness and bandwidth", "", f"`{bench['command']}` (exit status {bench['returncode']}; "
                "the full report is devicecheck/report.md)", ""]
        if bench["report"]:
            copy = bench["report"].get("copy_bandwidth")
            if copy:
                out += [f"Copy bandwidth: {copy['gbs']:.1f} GB/s.", ""]
            out += [*summary_table(bench["report"]), ""]
        if report.get("counterparts"):
            out += ["| op | torch_npu counterpart | shape | µs | GB/s | vmi µs | vmi / torch_npu time |",
                    "| --- | --- | --- | --- | --- | --- | --- |"]
            for row in report["counterparts"]:
                if "us" not in row:
                    out.append(f"| {row['op']} | {row['counterpart']} | {row['shape']} | {row['error']} | | | |")
                    continue
                vmi = _vmi_time(bench["report"], row["op"], row["shape"])
                ratio = f"{vmi / row['us']:.2f}" if vmi else "-"
                out.append(f"| {row['op']} | {row['counterpart']} | {row['shape']} | {row['us']:.1f} "
                           f"| {row['gbs']:.1f} | {vmi or '-'} | {ratio} |")
            out.append("")
    return "\n".join(out)


def _vmi_time(report: dict, op: str, shape: str) -> float | None:
    for b in report.get("ops", {}).get(op, {}).get("bench", []):
        if "x".join(map(str, b["shape"])) == shape:
            return round(b["call_us"], 1)
    return None


def write(report: dict, out: Path) -> None:
    report["elapsed_s"] = time.monotonic() - _t0
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))


def main(argv: list[str] | None = None) -> int:
    from .calibration import CALIBRATIONS

    parser = argparse.ArgumentParser(prog="python -m vmi_devkit.npu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("ascend", "ascend-sim"), default="ascend")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "npu-check-out"))
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--calibrations", default=",".join(CALIBRATIONS),
                        help=f"comma-separated (default all): {', '.join(CALIBRATIONS)}")
    parser.add_argument("--families", default=",".join(FAMILIES), help="tests: comma-separated (default all)")
    parser.add_argument("--tests-k", metavar="EXPR", help="tests: a pytest -k expression selecting tests")
    parser.add_argument("--quick", action="store_true", help="bench: default options, default shape, one bench shape")
    parser.add_argument("--ops", help="bench: comma-separated op names (default: all)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="worker processes of the tests and of the device check")
    parser.add_argument("--bench-budget", type=float, default=1800.0, help="seconds for the device check")
    parser.add_argument("--repeat", type=int, default=30, help="bench: timed calls per op (or counterpart) and shape")
    args = parser.parse_args(argv)
    stages = args.stages.split(",")
    if unknown := set(stages) - set(STAGES):
        parser.error(f"--stages: unknown {sorted(unknown)}; choose from {', '.join(STAGES)}")
    families = args.families.split(",")
    if unknown := set(families) - set(FAMILIES):
        parser.error(f"--families: unknown {sorted(unknown)}; choose from {', '.join(FAMILIES)}")
    names = args.calibrations.split(",")
    if unknown := set(names) - set(CALIBRATIONS):
        parser.error(f"--calibrations: unknown {sorted(unknown)}; choose from {', '.join(CALIBRATIONS)}")
    if args.target == "ascend":
        import torch

        if not (hasattr(torch, "npu") and torch.npu.is_available()):
            parser.error("target ascend needs torch_npu and an NPU; --target ascend-sim runs on the CPU")
    args.out.mkdir(parents=True, exist_ok=True)
    from vmi_core.compile import configure_tilelang_logging

    configure_tilelang_logging(logging.ERROR)  # TileLang's compile log: progress is this module's
    report = {"environment": environment(args.target, args.jobs)}
    log("  ".join(f"{k}={v}" for k, v in report["environment"].items() if v))
    if "calibrate" in stages:
        report["calibrations"] = calibrate_all(args.target, names)
        write(report, args.out)
    if "tests" in stages:
        report["tests"] = run_tests(args.target, args.out, families, args.jobs, args.tests_k)
        write(report, args.out)
    if "bench" in stages:
        report["bench"] = run_devicecheck(args.target, args.out, args)
        report["counterparts"] = run_counterparts(args.target, args.ops and args.ops.split(","), args.quick,
                                                  args.repeat)
        write(report, args.out)
    write(report, args.out)
    log(f"wrote {args.out / 'report.md'} and report.json: {'FAIL' if failed(report) else 'pass'}")
    return 1 if failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())
