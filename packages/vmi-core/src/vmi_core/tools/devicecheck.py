"""Every installed op on one target, against its reference and timed: a report for a device host.

    python -m vmi_core.tools.devicecheck [--target cuda|ascend|...] [--out DIR] [--quick] [--ops a,b] [--jobs N]

For each op ``registry.discover()`` lists:

* correctness: a covering set of options (the defaults, then every choice of every option
  on top of them; a value the op rejects alone is retried with one other option changed, as
  ``use_packed_ue8m0`` needs ``round_sf``) at three shapes (``default_shape``, one row, and a
  tail: rows and columns that are not tile multiples), each compared with ``op.check``; a
  ``ValueError`` from the op counts as a rejection, not a failure;
* benchmark: the default options at each of ``op.bench_shapes``: the time of one op call and
  of its kernels on the device, the reference's time (on the CPU), GB/s, and the fraction of
  the device's copy bandwidth that is.

On ``cuda`` the run ends by adding itself to each family's ``cuda_record.json``
(``vmi_core.cuda_record``: the kernel sources every case launched, passed or not; the gate launches
only those that passed) in ``--out``/cuda_record/ and, with ``--record-into TREE``, over the
source tree's own; ``$VMI_DEVICECHECK_COMMIT`` names the commit tested. The workers run with the
gate open.

Option sets run in ``--jobs`` worker processes (vmi compiles one kernel at a time per process, and
compiling is most of the time). Writes ``report.md`` and ``report.json`` to ``--out`` (rewritten
as results come in, so a run cut short leaves what it had) and prints the summary last; exits 1
if a case failed or raised. The reference runs with the target's flavor; ``--target cpu`` or
``ascend-sim`` checks this harness without a device. On ``ascend`` (``scripts/npu-check`` runs it)
times come from NPU events around the op call: GB/s there includes the call's Python overhead.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import logging
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from .. import __version__, cuda_record
from ..targets import TARGETS, device_of, resolve_flavor
from .registry import OpInfo, discover

MAX_LINES = 12  # mismatch lines kept per case

_t0 = time.monotonic()  # CLOCK_MONOTONIC: the workers are given the parent's


def log(message: str) -> None:
    # One write per line, so lines from several processes do not interleave.
    sys.stdout.write(f"{datetime.datetime.now():%H:%M:%S} [{time.monotonic() - _t0:6.1f}s] {message}\n")
    sys.stdout.flush()


def installed_ops() -> dict[str, OpInfo]:
    ops = {op.name: op for op in discover().values()}
    from ..compile import configure_tilelang_logging

    # TileLang's compile log, even its warnings: progress is this module's.
    configure_tilelang_logging(logging.ERROR)
    return ops


def to_device(obj, device: str):
    """``obj`` (tensors, possibly nested in tuples, lists and dicts) on ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(item, device) for item in obj)
    if isinstance(obj, dict):
        return {key: to_device(value, device) for key, value in obj.items()}
    return obj


def last_line(error: BaseException) -> str:
    lines = [line for line in traceback.format_exception_only(error)[-1].splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


# --- what to run ----------------------------------------------------------------------------------

def option_values(option) -> tuple:
    if option.choices:
        return option.choices
    if isinstance(option.default, bool):
        return (False, True)
    return (option.default,)  # a free int or string: its default only


def option_plans(op: OpInfo, quick: bool) -> list[tuple[str, list[dict]]]:
    """(label, candidate option sets): the first candidate the op accepts is the one run."""
    defaults = {o.name: o.default for o in op.options}
    plans = [("defaults", [defaults])]
    if quick:
        return plans
    for option in op.options:
        for value in option_values(option):
            if value == option.default:
                continue
            single = {**defaults, option.name: value}
            pairs = [{**single, other.name: v} for other in op.options if other is not option
                     for v in option_values(other) if v != other.default]
            plans.append((f"{option.name}={value}", [single, *pairs]))
    return plans


def case_shapes(op: OpInfo, quick: bool) -> list[tuple[int, ...]]:
    if quick:
        return [tuple(op.default_shape)]
    rows, *cols = op.default_shape
    # Rows = 2 mod 4 end mid-tile for every tile height above 2 and stay even (the gate backward
    # takes whole sequences of 2); 64 fewer columns end mid-block for blocks of 128 and keep the
    # multiple of 64 the quantization ops require.
    tail = (rows // 4 + 38, *(c - 64 if c > 128 else c for c in cols))
    # The default shape first: every op accepts it, so a rejection there is one of the options.
    return [tuple(op.default_shape), (1, *cols), tail]


def changed(op: OpInfo, options: dict) -> str:
    diff = [f"{o.name}={options[o.name]}" for o in op.options if options[o.name] != o.default]
    return " ".join(diff) or "defaults"


# --- correctness --------------------------------------------------------------------------------

class Sweep:
    def __init__(self, target: str, deadline: float):
        self.target = target
        self.device = device_of(target)
        self.flavor = resolve_flavor(target).name
        self.deadline = deadline

    def case(self, op: OpInfo, options: dict, shape, seed: int = 0) -> dict:
        record = {"options": changed(op, options), "shape": list(shape)}
        start = time.monotonic()
        try:
            with cuda_record.recording() as launched:
                record["launched"] = launched  # the cuda kernels this case ran, for the record
                inputs = op.make_inputs(shape, options, seed)
                outputs = op.run(to_device(inputs, self.device), options, self.target, self.flavor)
        except ValueError as error:
            return {**record, "status": "rejected", "detail": last_line(error)}
        except Exception as error:  # noqa: BLE001 (one case must not stop the sweep)
            return {**record, **_error(error)}
        try:
            expected = op.reference(inputs, options, self.flavor)
            lines = op.check(to_device(outputs, "cpu"), expected)
        except Exception as error:  # noqa: BLE001
            return {**record, **_error(error)}
        record.update(status="fail" if lines else "pass", seconds=round(time.monotonic() - start, 3))
        if lines:
            record["detail"] = lines[:MAX_LINES]
        return record

    def plan(self, op: OpInfo, label: str, candidates: list[dict], shapes) -> list[dict]:
        if time.monotonic() > self.deadline:
            return [{"options": label, "shape": None, "status": "skipped", "detail": "time budget spent"}]
        rejections = []
        for options in candidates:
            first = self.case(op, options, shapes[0])
            if first["status"] != "rejected":
                break
            rejections.append(first)
        else:
            log(f"{op.name:<30} {label}: rejected ({rejections[0]['detail']})")
            return [{**rejections[0], "options": label}]
        cases = [first, *(self.case(op, options, shape) for shape in shapes[1:])]
        counted = [c for c in cases if c["status"] != "rejected"]
        passed = sum(c["status"] == "pass" for c in counted)
        bad = [f"{c['status'].upper()} {'x'.join(map(str, c['shape']))}: {_first(c)}" for c in counted
               if c["status"] != "pass"]
        log(f"{op.name:<30} {changed(op, options)}: {passed}/{len(counted)} pass" + "".join(f"; {b}" for b in bad))
        return cases


_worker: dict = {}


def _init_worker(target: str, quick: bool, deadline: float, t0: float, threads: int) -> None:
    global _t0
    _t0 = t0
    os.environ[cuda_record.OPT_IN_ENV] = "1"  # the check runs the kernels the gate refuses until it passes them
    torch.set_num_threads(threads)  # the workers share the cores
    _worker.update(ops=installed_ops(), sweep=Sweep(target, deadline), quick=quick)


def _run_plan(name: str, index: int) -> list[dict]:
    op, quick = _worker["ops"][name], _worker["quick"]
    label, candidates = option_plans(op, quick)[index]
    return _worker["sweep"].plan(op, label, candidates, case_shapes(op, quick))


def _bench_op(name: str, shapes: list, repeat: int, copy_gbs: float, deadline: float) -> tuple[list, list]:
    """Every bench shape of one op, in a worker of its own (a kernel fault stays in that process)."""
    op, sweep = _worker["ops"][name], _worker["sweep"]
    results, errors = [], []
    for shape in shapes:
        if time.monotonic() > deadline:
            errors.append(f"{_fmt_shape(shape)}: skipped, time budget spent")
            continue
        try:
            results.append(bench(op, shape, sweep, repeat, copy_gbs))
        except Exception as error:  # noqa: BLE001 (record it, go on)
            errors.append(f"{_fmt_shape(shape)}: {last_line(error)}")
            if sweep.device in ACCELERATORS:
                break  # the context is poisoned: later shapes would only repeat the fault
    return results, errors


def _error(error: BaseException) -> dict:
    return {"status": "error", "detail": last_line(error), "traceback": traceback.format_exc()[-4000:]}


def _first(case: dict) -> str:
    detail = case.get("detail", "")
    return (detail[0].strip() if isinstance(detail, list) and detail else str(detail))[:200]


# --- timing ---------------------------------------------------------------------------------------

ACCELERATORS = ("cuda", "npu")  # devices timed by their own events (torch.cuda / torch_npu's torch.npu)


def call_time(fn, repeat: int, device: str) -> float:
    """Median seconds of one ``fn()`` call, as the device sees it on an accelerator (its events)."""
    if device not in ACCELERATORS:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    accelerator = getattr(torch, device)
    pairs = [(accelerator.Event(enable_timing=True), accelerator.Event(enable_timing=True)) for _ in range(repeat)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    accelerator.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in pairs) / 1e3


def kernel_time(fn, repeat: int) -> float | None:
    """Device-busy seconds per ``fn()`` call (kernels, copies, fills) from the CUDA profiler, or None.

    An op call also validates arguments and launches from Python; at large shapes that can take
    longer than the kernel, so GB/s is computed from this time where the profiler gives it.
    """
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(repeat):
                fn()
            torch.cuda.synchronize()
        busy_us = sum(e.time_range.elapsed_us() for e in prof.events()
                      if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
    except Exception as error:  # noqa: BLE001 (no CUPTI: fall back to the call time)
        log(f"profiler unavailable ({last_line(error)}); GB/s from the op call time")
        return None
    return busy_us / repeat / 1e6 if busy_us > 0 else None


def copy_bandwidth(device: str) -> dict:
    """Bytes per second of a large device-to-device ``dst.copy_(src)``, counting read and write."""
    on_accelerator = device in ACCELERATORS
    nbytes = (1 << 30) if on_accelerator else (256 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = call_time(lambda: dst.copy_(src), 20 if on_accelerator else 5, device)
    return {"bytes_per_copy": 2 * nbytes, "seconds": seconds, "gbs": 2 * nbytes / seconds / 1e9}


def bench(op: OpInfo, shape, sweep: Sweep, repeat: int, copy_gbs: float) -> dict:
    options = {o.name: o.default for o in op.options}
    inputs = op.make_inputs(shape, options, 0)
    on_device = to_device(inputs, sweep.device)

    def call():
        return op.run(on_device, options, sweep.target, sweep.flavor)

    outputs = to_device(call(), "cpu")  # compiles, if this shape needs its own kernel
    for _ in range(3):
        call()
    call_s = call_time(call, repeat, sweep.device)
    kernel_s = kernel_time(call, repeat) if sweep.device == "cuda" else None
    ref_times = []
    while len(ref_times) < 3 and sum(ref_times) < 1.0:  # a large reference takes seconds: time it once
        start = time.perf_counter()
        expected = op.reference(inputs, options, sweep.flavor)
        ref_times.append(time.perf_counter() - start)
    nbytes = op.nbytes(inputs, outputs)
    seconds = kernel_s or call_s
    gbs = nbytes / seconds / 1e9
    return {"shape": list(shape), "call_us": call_s * 1e6, "kernel_us": None if kernel_s is None else kernel_s * 1e6,
            "reference_ms": statistics.median(ref_times) * 1e3, "nbytes": nbytes, "gbs": gbs,
            "copy_fraction": gbs / copy_gbs, "gbs_from": "kernel" if kernel_s else "call",
            "matches": not op.check(outputs, expected)}


# --- report ---------------------------------------------------------------------------------------

def environment(target: str, jobs: int) -> dict:
    import tilelang

    env = {"target": target, "vmi_core": __version__, "vmi_source": os.environ.get("VMI_DEVICECHECK_SOURCE", ""),
           "vmi_commit": os.environ.get("VMI_DEVICECHECK_COMMIT", ""),
           "torch": torch.__version__, "tilelang": tilelang.__version__, "python": sys.version.split()[0],
           "cpu_count": os.cpu_count(), "jobs": jobs,
           "reference": f"torch on the CPU, {torch.get_num_threads()} threads"}
    if target == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, capability=f"sm_{props.major}{props.minor}", cuda=torch.version.cuda,
                   arch=os.environ.get("VMI_CUDA_ARCH", "sm_90a"))
        from tilelang.contrib.nvcc import get_nvcc_compiler

        nvcc = get_nvcc_compiler()  # the one TileLang compiles with
        try:
            version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
            env["nvcc"] = version.strip().splitlines()[-1]
        except (OSError, IndexError):
            env["nvcc"] = f"not found ({nvcc})"
    if target == "ascend":
        import torch_npu

        env.update(npu=torch.npu.get_device_name(0), torch_npu=torch_npu.__version__,
                   cann=os.environ.get("ASCEND_TOOLKIT_HOME", "") or os.environ.get("ASCEND_HOME_PATH", ""))
    return env


def op_summary(name: str, result: dict) -> dict:
    cases = [c for c in result["cases"] if c["status"] in ("pass", "fail", "error")]
    best = max(result.get("bench", []), key=lambda b: b["gbs"], default=None)
    return {"op": name, "passed": sum(c["status"] == "pass" for c in cases), "total": len(cases),
            "failed": sum(c["status"] == "fail" for c in cases), "errors": sum(c["status"] == "error" for c in cases),
            "rejected": sum(c["status"] == "rejected" for c in result["cases"]),
            "skipped": sum(c["status"] == "skipped" for c in result["cases"]),
            "criterion": result["criterion"], "best": best}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _fmt_shape(shape) -> str:
    return "x".join(map(str, shape)) if shape else "-"


def summary_table(report: dict) -> list[str]:
    lines = ["| op | cases pass/total | rejected | failed | errors | check | best GB/s (shape) | of copy BW |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, result in report["ops"].items():
        s = op_summary(name, result)
        best = s["best"]
        gbs = f"{best['gbs']:.1f} ({_fmt_shape(best['shape'])})" if best else "-"
        frac = f"{best['copy_fraction']:.0%}" if best else "-"
        skipped = f" (+{s['skipped']} skipped)" if s["skipped"] else ""
        lines.append(f"| {name} | {s['passed']}/{s['total']}{skipped} | {s['rejected']} | {s['failed']} "
                     f"| {s['errors']} | {_cell(s['criterion'])} | {gbs} | {frac} |")
    return lines


def markdown(report: dict) -> str:
    env, copy = report["environment"], report.get("copy_bandwidth")
    out = [f"# vmi device check: target {env['target']}", ""]
    out += [f"- {key}: {value}" for key, value in env.items() if value not in ("", None)]
    if copy:
        out.append(f"- copy bandwidth: {copy['gbs']:.1f} GB/s (dst.copy_(src) of "
                   f"{copy['bytes_per_copy'] / 2**31:.2f} GiB, read + write counted)")
    out.append(f"- elapsed: {report['elapsed_s']:.0f} s{'' if report['complete'] else ' (incomplete)'}")
    out += ["", "## Summary", "", *summary_table(report), ""]
    out += ["GB/s: bytes the op reads and writes (`op.nbytes`) over the device-busy time of one call "
            "(CUDA profiler; the op-call time where it is unavailable). The reference runs on the CPU.", ""]
    for name, result in report["ops"].items():
        s = op_summary(name, result)
        out += [f"## {name}", "", f"{s['passed']}/{s['total']} cases pass ({s['criterion']}); "
                f"{s['rejected']} rejected, {s['skipped']} skipped.", ""]
        rejected = {}
        for case in result["cases"]:
            where = f"{case['options']} at {_fmt_shape(case['shape'])}"
            if case["status"] in ("rejected", "skipped"):
                rejected.setdefault((case["status"], case["detail"]), []).append(where)
            elif case["status"] != "pass":
                detail = case["detail"] if isinstance(case["detail"], list) else [case["detail"]]
                out += [f"- {case['status']}: {where}", "", "  ```", *[f"  {line}" for line in detail], "  ```"]
        for (status, detail), cases in rejected.items():
            out.append(f"- {status} ({len(cases)}): {detail}: {'; '.join(cases)}")
        if result.get("bench"):
            out += ["", "| shape | op call µs | kernel µs | reference ms (CPU) | MB moved | GB/s | of copy BW "
                    "| matches |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
            for b in result["bench"]:
                kernel = f"{b['kernel_us']:.1f}" if b["kernel_us"] is not None else "-"
                out.append(f"| {_fmt_shape(b['shape'])} | {b['call_us']:.1f} | {kernel} | {b['reference_ms']:.1f} "
                           f"| {b['nbytes'] / 1e6:.1f} | {b['gbs']:.1f} | {b['copy_fraction']:.0%} | {b['matches']} |")
        for error in result.get("bench_errors", []):
            out.append(f"- bench error: {error}")
        out.append("")
    return "\n".join(out)


def write(report: dict, out: Path) -> None:
    report["elapsed_s"] = time.monotonic() - _t0
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))


# --- the cuda record ----------------------------------------------------------------------------

def updated_records(report: dict, ops: dict[str, OpInfo]) -> dict[str, dict]:
    """Each family's ``cuda_record.json`` with this run added: the run, each op's outcome, and each
    kernel source the cases launched (``pass`` only if every case that launched it passed)."""
    env = report["environment"]
    date = datetime.date.today().isoformat()
    run_id = f"{env['gpu'].split()[-1].lower()}-{date}-{env['vmi_commit'][:12] or 'uncommitted'}"
    run = {"gpu": env["gpu"], "date": date, "commit": env["vmi_commit"] or None,
           **{key: env[key] for key in ("vmi_source", "torch", "cuda", "nvcc", "tilelang", "arch")}}
    records: dict[str, dict] = {}
    for name, result in report["ops"].items():
        package = f"vmi_{ops[name].family}"
        record = records.setdefault(package, json.loads(json.dumps(cuda_record.family_record(package))))
        record["runs"][run_id] = run
        counted = [c for c in result["cases"] if c["status"] in ("pass", "fail", "error")]
        bad = [c for c in counted if c["status"] != "pass"]
        summary = f"{len(counted) - len(bad)}/{len(counted)} cases pass ({result['criterion']})"
        if bad:
            first = bad[0]
            summary += f"; first {first['status']}: {first['options']} at {_fmt_shape(first['shape'])}: {_first(first)}"
        record["ops"][name] = {"run": run_id, "summary": summary}
        for case in counted:
            for launch in case.get("launched", ()):
                kernel = record["kernels"].get(launch["digest"])
                if kernel is None or kernel["run"] != run_id:
                    kernel = record["kernels"][launch["digest"]] = {
                        "kernel": launch["kernel"], "spec": launch["spec"], "ops": [], "run": run_id, "result": "pass"}
                if name not in kernel["ops"]:
                    kernel["ops"].append(name)
                if case["status"] != "pass" and kernel["result"] == "pass":
                    kernel.update(result=case["status"],
                                  detail=f"{name} {case['options']} at {_fmt_shape(case['shape'])}: {_first(case)}")
    return records


def write_records(records: dict[str, dict], out: Path, tree: Path | None) -> None:
    """The records into ``out/cuda_record/`` and, given the source tree, over its packages' own."""
    (out / "cuda_record").mkdir(exist_ok=True)
    for package, record in records.items():
        text = json.dumps(record, indent=1) + "\n"
        (out / "cuda_record" / f"{package}.json").write_text(text)
        if tree is not None:
            (tree / "packages" / package.replace("_", "-") / "src" / package / cuda_record.RECORD_FILE).write_text(text)


# --- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vmi_core.tools.devicecheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=TARGETS, default="cuda")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"))
    parser.add_argument("--quick", action="store_true", help="default options, default shape, one bench shape")
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) * 3 // 4),
                        help="worker processes checking option sets (each compiles its own kernels)")
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds for the whole run: option sets not started by 70%% of it and bench "
                             "shapes not started by its end are skipped")
    parser.add_argument("--repeat", type=int, default=30, help="timed calls per bench shape")
    parser.add_argument("--record-into", type=Path, metavar="TREE",
                        help="also write the cuda record over the packages' own in this source tree")
    args = parser.parse_args(argv)

    ops = installed_ops()
    if args.ops:
        unknown = set(args.ops.split(",")) - set(ops)
        if unknown:
            parser.error(f"unknown ops {sorted(unknown)}; installed: {', '.join(sorted(ops))}")
        ops = {name: ops[name] for name in args.ops.split(",")}
    sweep = Sweep(args.target, _t0 + 0.7 * args.budget)
    if sweep.device == "cuda" and not torch.cuda.is_available():
        parser.error("target cuda, but torch sees no CUDA device")
    if sweep.device == "npu" and not (hasattr(torch, "npu") and torch.npu.is_available()):
        parser.error("target ascend, but torch sees no NPU (torch_npu not installed, or no device)")
    args.out.mkdir(parents=True, exist_ok=True)

    report = {"environment": environment(args.target, args.jobs), "complete": False,
              "ops": {name: {"criterion": op.check_criterion, "cases": []} for name, op in sorted(ops.items())}}
    log("  ".join(f"{k}={v}" for k, v in report["environment"].items() if v))
    report["copy_bandwidth"] = copy_bandwidth(sweep.device)
    log(f"copy bandwidth {report['copy_bandwidth']['gbs']:.1f} GB/s")

    # Round robin over the ops (every op's defaults first), so a spent budget skips evenly.
    per_op = [[(name, i, label) for i, (label, _) in enumerate(option_plans(op, args.quick))]
              for name, op in ops.items()]
    work = [item for row in itertools.zip_longest(*per_op) for item in row if item]
    cases = sum(len(case_shapes(ops[name], args.quick)) for name, _, _ in work)
    log(f"correctness: {len(ops)} ops, {len(work)} option sets, {cases} cases, {args.jobs} worker processes")
    # Spawned, not forked: the parent has initialised the device. On an accelerator, a fresh process
    # per option set: a kernel fault poisons its process's device context, which must not fail the
    # sets after it (on the CPU a worker is reused: a fresh one costs seconds of imports).
    init = (args.target, args.quick, sweep.deadline, _t0, max(1, torch.get_num_threads() // args.jobs))
    fresh = 1 if sweep.device in ACCELERATORS else None
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=init, max_tasks_per_child=fresh) as pool:
        futures = [(name, label, pool.submit(_run_plan, name, index)) for name, index, label in work]
        for name, label, future in futures:
            try:
                report["ops"][name]["cases"] += future.result()
            except Exception as error:  # noqa: BLE001 (a worker that died: record it, go on)
                report["ops"][name]["cases"].append({"options": label, "shape": None, **_error(error)})
            write(report, args.out)

    log("benchmark: default options at each bench shape")
    copy_gbs = report["copy_bandwidth"]["gbs"]
    # One op at a time (timings see an idle device): on an accelerator each in a fresh process, on the
    # CPU in this one (no device context to poison).
    bench_init = (*init[:-1], torch.get_num_threads())
    if fresh is None:
        _init_worker(*bench_init)
    with (ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                              initargs=bench_init, max_tasks_per_child=fresh) if fresh else
          contextlib.nullcontext()) as pool:
        for name, op in sorted(ops.items()):
            result = report["ops"][name]
            shapes = list(op.bench_shapes[:1] if args.quick else op.bench_shapes)
            bench_args = (name, shapes, args.repeat, copy_gbs, _t0 + args.budget)
            try:
                result["bench"], result["bench_errors"] = (pool.submit(_bench_op, *bench_args).result() if pool
                                                           else _bench_op(*bench_args))
            except Exception as error:  # noqa: BLE001 (a worker that died)
                result["bench"], result["bench_errors"] = [], [f"worker died: {last_line(error)}"]
            for b in result["bench"]:
                kernel = f"kernel {b['kernel_us']:.1f} us, " if b["kernel_us"] is not None else ""
                log(f"{name:<30} bench {_fmt_shape(b['shape'])}: call {b['call_us']:.1f} us, {kernel}"
                    f"{b['gbs']:.1f} GB/s ({b['copy_fraction']:.0%} of copy), reference {b['reference_ms']:.1f} ms"
                    + ("" if b["matches"] else "  MISMATCH"))
            for line in result["bench_errors"]:
                log(f"{name:<30} bench {line}")
            write(report, args.out)

    report["complete"] = True
    write(report, args.out)
    if args.target == "cuda":
        write_records(updated_records(report, ops), args.out, args.record_into)
    log(f"wrote {args.out / 'report.md'} and report.json")
    print("\n".join(summary_table(report)), flush=True)
    bad = any(c["status"] in ("fail", "error") for r in report["ops"].values() for c in r["cases"])
    bad = bad or any(not b["matches"] for r in report["ops"].values() for b in r["bench"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
