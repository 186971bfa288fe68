"""The ``vmi`` command: list, run, benchmark and show the source of vmi's ops.

    vmi list
    vmi run OP [--shape 4096x7168] [--target cpu|ascend-sim|...] [--flavor ascend] [-o name=value ...]
    vmi bench OP [--shape ...] [--tokens 1,16,...] [--min-time S] [--threads 1,2] [--plot FILE.png] [-o name=value ...]
    vmi bench OP --overhead [--tokens 1,4,16] [--shape ...] [-o name=value ...]
    vmi source OP --target ascend|cuda|cpu [-o name=value ...]
    vmi source OP --target ascend --stats [--shape ...] [-o name=value ...]
    vmi precompile [--family F] [--target T ...] [--ops OP ...] [--from-config FILE] [-j N]
    vmi cache info
    vmi cache clear [--op OP ...] [--target T ...] [--stale] [--yes]
    vmi demo [NAME] [the demo's options]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path

import torch

from ..compile import cache_dir
from ..targets import FLAVORS, TARGETS, device_of, resolve_flavor
from . import bench
from . import cache as vmi_cache
from .registry import OpInfo, discover

# The distributions that bring ops (each declares its package in the ``vmi.ops`` entry-point group).
FAMILY_DISTRIBUTIONS = ("vmi-quant", "vmi-mhc", "vmi-moe")


class UserError(Exception):
    """A mistake in the command line: reported as one line, exit status 2."""


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 4096x7168, got {text!r}") from None
    if any(n < 0 for n in shape):
        raise argparse.ArgumentTypeError(f"shape sizes must not be negative, got {text!r}")
    return shape


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _thread_counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(_positive(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be positive integers separated by commas, got {text!r}") from None


def _check_device(target: str) -> None:
    """The device a target's tensors live on must be present (``ascend-sim`` and ``cpu`` run here)."""
    device = device_of(target)
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"target {target!r} needs a CUDA GPU, and torch sees none on this host "
                        f"(--target cpu or ascend-sim run here)")
    if device == "npu" and not (hasattr(torch, "npu") and torch.npu.is_available()):
        raise UserError(f"target {target!r} needs an Ascend NPU with torch_npu, and none is available on this "
                        f"host (--target ascend-sim runs the ascend kernels on the CPU)")


def _check_shape(op: OpInfo, shape: tuple[int, ...]) -> None:
    if len(shape) != len(op.default_shape):
        raise UserError(f"--shape: {op.name} takes a {len(op.default_shape)}-D shape like "
                        f"{'x'.join(map(str, op.default_shape))}, got {'x'.join(map(str, shape))}")


def _installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` from its metadata (nothing is imported), or None."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _op(ops: dict[str, OpInfo], name: str) -> OpInfo:
    if name not in ops:
        close = difflib.get_close_matches(name, ops, n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else "`vmi list` shows the installed ops"
        missing = [name for name in FAMILY_DISTRIBUTIONS if _installed_version(name) is None]
        if missing:
            hint += f" ({', '.join(missing)} not installed: their ops are not known here)"
        raise UserError(f"unknown op {name!r}; {hint}")
    return ops[name]


def cmd_list(ops: dict[str, OpInfo], args) -> int:
    unique = sorted({op.name: op for op in ops.values()}.values(), key=lambda op: (op.family, op.name))
    if not unique:
        print(f"no ops installed (install {', '.join(FAMILY_DISTRIBUTIONS[:-1])} or {FAMILY_DISTRIBUTIONS[-1]})")
        return 0
    if args.json:
        print(json.dumps([{"name": op.name, "family": op.family, "summary": op.summary,
                           "targets": {target: op.targets.get(target, "not available") for target in TARGETS}}
                          for op in unique], indent=1))
        return 0
    width = max(len(op.name) for op in unique)
    for op in unique:
        print(f"{op.name:<{width}}  [{op.family}] {op.summary}")
        if not args.compact:
            for target in TARGETS:
                print(f"{'':<{width}}    {target:<10} {op.targets.get(target, 'not available')}")
    return 0


def cmd_run(ops, args) -> int:
    op = _op(ops, args.op)
    options = op.parse_options(args.opt)
    shape = args.shape or op.default_shape
    _check_shape(op, shape)
    target = args.target
    _check_device(target)
    # ascend, ascend-sim and cuda run their own flavor (asking for another is an error, as in the
    # API): the reference must use it too.
    flavor = resolve_flavor(target, args.flavor).name
    inputs = op.make_inputs(shape, options, args.seed)
    if device_of(target) != "cpu":
        print(f"note: target {target!r} needs its device; the inputs are moved there")
    start = time.perf_counter()
    outputs = op.run(inputs, options, target, flavor)
    first = time.perf_counter() - start
    # Timed as `vmi bench` times.
    kernel = bench.measure(op.bound(inputs, options, target, flavor), args.min_time)
    # The reference is written for exact bits, not speed (seconds at large shapes): one call.
    start = time.perf_counter()
    expected = op.reference(inputs, options, flavor)
    ref_s = time.perf_counter() - start
    mismatches = op.check(outputs, expected)
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    print(f"{op.name} shape={'x'.join(map(str, shape))} target={target} flavor={flavor} {shown}")
    print(f"  first call (includes compile or cache load): {first * 1e3:.1f} ms")
    # No ratio against the reference (`vmi bench` compares with a torch baseline).
    print(f"  kernel {kernel.median * 1e3:.3f} ms (median of {kernel.calls} calls, interquartile range "
          f"{kernel.iqr * 1e3:.3f} ms), bit-exact torch reference "
          f"{ref_s * 1e3:.3f} ms (one call; `vmi bench` compares with a torch baseline)")
    if mismatches:
        print("  MISMATCH against the reference:")
        print("\n".join(mismatches))
        return 1
    print(f"  matches the reference {op.check_criterion}")
    return 0


# Shapes with at most this many rows are decode sizes: reported in microseconds per call.
DECODE_ROWS = 16
NO_BASELINE = ("none installed (the torch baselines come with the vmi repository's development kit, "
               "shared/; kernel, reference and copy bandwidth only)")


def _baseline_runs(baseline, num_rows: int) -> list[int | None]:
    """The row chunkings to try: the whole tensor and 128-row chunks (the reference fallback: chunks only)."""
    if not baseline.chunks or num_rows <= bench.CHUNK_ROWS:
        return [None]
    return [bench.CHUNK_ROWS] if baseline.is_reference else [None, bench.CHUNK_ROWS]


def _bench_shape(op: OpInfo, options: dict, baseline, inputs: dict, flavor: str, min_time: float) -> dict:
    """Times (``bench.measure``) of the kernel, the reference and the baseline (if any) at one shape.

    The reference goes first, then the kernel and the baseline back to back: how fast a large output
    is allocated depends on what the C heap went through before (freed memory it kept lands the next
    allocation on pages already faulted in: a 4096x7168 ``x.to(bfloat16)`` took 11 ms after the
    reference and 50 ms before it), so the two compared are timed after the same history."""
    reference = bench.measure(lambda: op.reference(inputs, options, flavor), min_time)
    expected = reference.result
    outputs = op.run(inputs, options, "cpu", flavor)
    kernel = bench.measure(op.bound(inputs, options, "cpu", flavor), min_time)
    row = {"kernel_s": kernel.median, "spread": kernel.iqr / kernel.median, "ref_s": reference.median,
           "nbytes": op.nbytes(inputs, outputs), "kernel_ok": not op.check(outputs, expected)}
    if baseline is None:
        return row
    num_rows = next(_tensors(inputs)).shape[0]
    try:
        best = None
        for rows in _baseline_runs(baseline, num_rows):
            timing = bench.measure(lambda rows=rows: baseline.run(inputs, flavor, rows), min_time)
            if best is None or timing.median < best[1]:
                best = (timing.result, timing.median, rows)
        result, row["base_s"], rows = best
        how = ("reference " if baseline.is_reference else "") + ("whole" if rows is None else f"chunked {rows}")
        if op.check(result, expected):
            bits = "differs"
        else:
            bits = "same" if op.check_criterion == "bit for bit" else "close"
        row["base_how"] = f"{how}, {bits}"
    except Exception as error:  # shown in the table; the command then exits with status 1
        row["base_error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    return row


def _throughput_line(shape, r: dict, copy_bps: float) -> str:
    def timed(seconds: float) -> str:
        return f"{seconds * 1e3:9.2f} ms {r['nbytes'] / seconds / 1e9:6.2f} GB/s"
    line = f"  {'x'.join(map(str, shape)):>11}  {timed(r['kernel_s'])}  {100 * r['spread']:5.1f}%  {timed(r['ref_s'])}"
    if "base_error" in r:
        return line + f"  baseline error: {r['base_error']}"
    base, vs = (timed(r["base_s"]), f"{r['base_s'] / r['kernel_s']:.2f}") if "base_s" in r else ("-", "-")
    return line + (f"  {base:>24}  {r.get('base_how', '-'):<27} {r['ref_s'] / r['kernel_s']:>10.1f}"
                   f"  {vs:>11}  {100 * r['nbytes'] / r['kernel_s'] / copy_bps:>5.1f}%")


def _decode_line(shape, r: dict) -> str:
    line = (f"  {'x'.join(map(str, shape)):>11}  {r['kernel_s'] * 1e6:9.1f} us  {100 * r['spread']:5.1f}%  "
            f"{r['ref_s'] * 1e6:9.1f} us")
    if "base_error" in r:
        return line + f"  baseline error: {r['base_error']}"
    base, vs = (f"{r['base_s'] * 1e6:.1f} us", f"{r['base_s'] / r['kernel_s']:.2f}") if "base_s" in r else ("-", "-")
    return line + f"  {base:>12}  {r.get('base_how', '-'):<27} {r['ref_s'] / r['kernel_s']:>10.1f}  {vs:>11}"


def _bench_overhead(op: OpInfo, options: dict, args) -> int:
    from . import overhead

    hidden = (args.shape or op.default_shape)[1:]
    shapes = [args.shape] if args.shape and not args.tokens else [(t, *hidden) for t in args.tokens or (1, 4, 16)]
    for shape in shapes:
        _check_shape(op, shape)
    flavor = resolve_flavor("cpu", args.flavor).name
    print(f"{op.name} (cpu, 1 thread, flavor {flavor}) options: {', '.join(f'{k}={v}' for k, v in options.items())}")
    print(f"  {'shape':>11}" + "".join(f"  {c:>10}" for c in overhead.COLUMNS) + "  launches  planned")
    refusals = {}
    with bench.threads(1):
        for shape in shapes:
            kernel_op, arguments = op.kernel_op_arguments(op.make_inputs(shape, options, args.seed), options, flavor)
            parts = overhead.split(kernel_op, arguments, flavor)
            print(f"  {'x'.join(map(str, shape)):>11}" + "".join(f"  {parts[c]:7.1f} us" for c in overhead.COLUMNS)
                  + f"  {parts['launches']:>8}  {'yes' if parts['planned'] == 'yes' else 'no':>7}")
            if parts["planned"] != "yes":
                refusals[parts["planned"]] = None
    print("us per call, best of 5 batches. call = types + dispatcher + plan + kernels; overhead = call - kernels; "
          "unplanned: the call without launch plans (" + overhead.__name__ + ").")
    for why in refusals:
        print(f"no plan: {why}")
    return 0


def cmd_bench(ops, args) -> int:
    op = _op(ops, args.op)
    options = op.parse_options(args.opt)
    if args.overhead:
        return _bench_overhead(op, options, args)
    make_baseline = bench.discover_baselines().get(op.name)
    baseline = None if make_baseline is None else make_baseline(op, options)
    if args.plot:
        from . import plot
        try:
            plot.require_matplotlib()
        except ImportError as error:
            raise UserError(str(error)) from None
    if args.tokens or args.plot:
        # A sweep of token counts at one hidden size: the --shape's, else the op's default.
        tokens = args.tokens or sorted({shape[0] for shape in op.bench_shapes})
        hidden = (args.shape or op.default_shape)[1:]
        shapes = [(t, *hidden) for t in tokens]
    else:
        shapes = [args.shape] if args.shape else list(op.bench_shapes)
    for shape in shapes:
        _check_shape(op, shape)
    flavor = resolve_flavor("cpu", args.flavor).name
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    inputs_of: dict = {}
    failed = False
    for n in args.threads:
        with bench.threads(n):
            copy_bps = bench.copy_bandwidth()
            print(f"{op.name} (cpu, {n} thread{'s' if n > 1 else ''}, flavor {flavor}) options: {shown}")
            print(f"  copy bandwidth {copy_bps / 1e9:.1f} GB/s (dst.copy_(src) of 256 MiB uint8, bytes read + "
                  f"written, median)")
            print(f"  baseline: {NO_BASELINE if baseline is None else baseline.what}")
            rows = {}
            for shape in shapes:
                if shape not in inputs_of:
                    inputs_of[shape] = op.make_inputs(shape, options, args.seed)
                rows[shape] = _bench_shape(op, options, baseline, inputs_of[shape], flavor, args.min_time)
            mismatch = {shape: "" if r["kernel_ok"] else "  (KERNEL MISMATCH)" for shape, r in rows.items()}
            big = [shape for shape in shapes if shape[0] > DECODE_ROWS]
            if big:
                print(f"  {'shape':>11}  {'kernel':>24}  {'spread':>6}  {'reference':>24}  {'baseline':>24}  "
                      f"{'baseline run':<27} "
                      f"{'vs ref':>10}  {'vs baseline':>11}  {'% copy':>6}")
                for shape in big:
                    print(_throughput_line(shape, rows[shape], copy_bps) + mismatch[shape])
            small = [shape for shape in shapes if shape[0] <= DECODE_ROWS]
            if small:
                print(f"  {'decode':>11}  {'kernel':>12}  {'spread':>6}  {'reference':>12}  {'baseline':>12}  "
                      f"{'baseline run':<27} "
                      f"{'vs ref':>10}  {'vs baseline':>11}")
                for shape in small:
                    print(_decode_line(shape, rows[shape]) + mismatch[shape])
            failed |= any("base_error" in r or not r["kernel_ok"] for r in rows.values())
    if args.plot:
        # The last thread count's timings.
        title = (f"{op.name} ({shown}), cpu, {n} thread{'s' if n > 1 else ''}, flavor {flavor}, "
                 f"hidden {'x'.join(map(str, shapes[0][1:]))}")
        plot.save_png(plot.throughput_figure(title, rows, copy_bps), args.plot)
        print(f"chart of GB/s by token count ({n} thread{'s' if n > 1 else ''}) written to {args.plot}")
    print(f"times: median per call of torch.utils.benchmark's blocked autorange (at least {args.min_time:g} s of "
          f"calls after a warm-up call), kernel, reference and baseline alike; spread: the kernel's interquartile "
          f"range / median. Ratios: the other's time / the kernel's (> 1: the kernel is faster).")
    print("% copy: the kernel's GB/s as a share of the copy bandwidth.")
    print(f"same / close / differs: the baseline's outputs against the reference ({op.check_criterion}).")
    return 1 if failed else 0


def cmd_precompile(ops, args) -> int:
    from . import precompile

    chosen = {op.name: op for op in ops.values()}
    if args.family:
        chosen = {name: op for name, op in chosen.items() if op.family == args.family}
    if args.ops:
        wanted = {_op(ops, name).name for name in args.ops}
        chosen = {name: op for name, op in chosen.items() if name in wanted}
    if args.from_config:
        calls = [call for call in precompile.load_config(args.from_config, ops) if call[0].name in chosen]
    else:
        calls = precompile.default_calls(list(chosen.values()))
    targets = tuple(args.target or (_host_target(),))
    todo = precompile.variants(calls, targets)
    print(f"precompile: {len(todo)} variants on {', '.join(targets)} into {cache_dir()}, "
          f"{min(args.jobs, len(todo))} processes")
    start = time.perf_counter()
    results = precompile.precompile(todo, args.jobs)
    print("\n".join(precompile.summary_lines(results, ops, time.perf_counter() - start)))
    return 1 if any(r.status == "failed" for r in results) else 0


def _host_target() -> str:
    """The target of this host's accelerator: cuda, ascend, else cpu."""
    if torch.cuda.is_available():
        return "cuda"
    if hasattr(torch, "npu") and torch.npu.is_available():
        return "ascend"
    return "cpu"


def cmd_cache(ops, args) -> int:
    if args.action == "info":
        print("\n".join(vmi_cache.info_lines(vmi_cache.info())))
        return 0
    if args.stale and (args.op or args.target):
        raise UserError("--stale removes whole directories of other cache keys: it takes no --op or --target")
    names = tuple(_op(ops, name).name if name in ops else name for name in args.op)
    plan = vmi_cache.plan_clear(names, tuple(args.target), stale_only=args.stale)
    if plan.empty:
        print("nothing to remove")
        return 0
    what = (f"{len(plan.directories)} cache key directories under {vmi_cache.info().root}" if plan.directories
            else f"{len(plan.records)} kernel variants ({len(plan.paths)} cache entries)")
    if not args.yes:
        if not sys.stdin.isatty():
            raise UserError(f"vmi cache clear would remove {what}; pass --yes to confirm")
        if input(f"remove {what}, {vmi_cache.format_size(plan.nbytes)}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    nbytes = plan.nbytes
    vmi_cache.clear(plan)
    print(f"removed {what}, {vmi_cache.format_size(nbytes)}")
    if plan.kept_unrecorded:
        print(f"kept {plan.kept_unrecorded} unrecorded entries (op and target unknown; `vmi cache clear` without "
              f"filters removes everything)")
    return 0


# `vmi demo` runs the callables of this entry-point group (``main(argv) -> exit status``), declared by
# the packages that ship demos (the meta-package vmi's block); vmi-core itself imports none of them.
DEMO_GROUP = "vmi.demos"
DEFAULT_DEMO = "block"
NO_DEMO = "none (`pip install vmi` installs the block demo)"


def cmd_demo(ops, args) -> int:
    demos = {ep.name: ep for ep in entry_points(group=DEMO_GROUP)}
    argv = list(args.demo_argv)
    name = argv.pop(0) if argv and not argv[0].startswith("-") else DEFAULT_DEMO
    if name not in demos:
        installed = ", ".join(sorted(demos)) or NO_DEMO
        raise UserError(f"no demo named {name!r}; installed: {installed}")
    return demos[name].load()(argv)


def cmd_source(ops, args) -> int:
    op = _op(ops, args.op)
    options = op.parse_options(args.opt)
    if args.stats:
        return _source_stats(op, options, args)
    print(op.source(options, args.target, args.flavor))
    return 0


def _source_stats(op: OpInfo, options: dict, args) -> int:
    """The Ascend kernel's vector regions (static) and what one launch executes on ascend-sim, per
    element of the op's largest input."""
    from ..ascend_sim import last_launch_stats
    from .source_checks import dma_counts, region_report

    if args.target not in ("ascend", "ascend-sim"):
        raise UserError("--stats describes the Ascend kernel: use --target ascend or ascend-sim")
    shape = args.shape or op.default_shape
    _check_shape(op, shape)
    src = op.source(options, "ascend", "ascend")
    print(f"{op.name} ascend kernel, {', '.join(f'{k}={v}' for k, v in options.items())}")
    for region in region_report(src):
        print(f"  {region.kind} region {region.name}: {region.vector_ops} vector instructions in the source, "
              f"{region.scalar_accesses} scalar UB accesses")
    gm_to_ub, ub_to_gm = dma_counts(src)
    print(f"  DMA calls in the source: {gm_to_ub} GM->UB, {ub_to_gm} UB->GM")
    inputs = op.make_inputs(shape, options, args.seed)
    op.run(inputs, options, "ascend-sim", "ascend")
    stats = last_launch_stats()
    elements = max(t.numel() for t in _tensors(inputs))
    print(f"one launch on ascend-sim, shape {'x'.join(map(str, shape))} ({elements} elements, {stats['cores']} cores):")
    for name in ("vector_instructions", "vector_loads", "vector_stores", "simt_ub_accesses",
                 "simd_scalar_ub_accesses", "scalar_ub_accesses", "dma_gm_to_ub_bytes", "dma_ub_to_gm_bytes"):
        print(f"  {name.replace('_', ' ')}: {stats[name]} ({stats[name] / elements:.3f} per element)")
    print(f"  regions launched: {stats['simd_regions']} SIMD, {stats['simt_regions']} SIMT")
    return 0


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors as one line (the usage is what ``--help`` prints)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


# What `vmi --version` names: vmi's distributions, then what their bits depend on.
VERSIONED = ("vmi-core", *FAMILY_DISTRIBUTIONS, "torch", "tilelang")


def versions() -> str:
    """The installed versions of ``VERSIONED``; a family that is not installed says so."""
    found = [(name, _installed_version(name)) for name in VERSIONED]
    return ", ".join(f"{name} {found_version or 'not installed'}" for name, found_version in found
                     if found_version or name in FAMILY_DISTRIBUTIONS)


class _Versions(argparse.Action):
    """``--version``: one line, unwrapped (argparse's own version action fills the text to the terminal)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(versions())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vmi", description="vmi kernel library: list, run, bench, source, precompile, cache, demo")
    parser.add_argument("--version", action=_Versions, help="the installed versions of vmi, torch and tilelang")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, the whole traceback instead of one line")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="ops and their status per target")
    form = listing.add_mutually_exclusive_group()
    form.add_argument("--compact", action="store_true", help="one line per op: name, family, summary")
    form.add_argument("--json", action="store_true", help="the same as JSON, with the status per target")

    def op_parser(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("op", help="the op's name (`vmi list`), e.g. per_token_cast")
        p.add_argument("-o", "--opt", action="append", default=[], metavar="NAME=VALUE",
                       help="an op option, e.g. -o fmt=e2m1 -o num_per_channels=16")
        p.add_argument("--flavor", choices=FLAVORS,
                       help="bit conventions: cpu runs either (default $VMI_FLAVOR, else ascend); ascend, "
                            "ascend-sim and cuda only their own")
        p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
        return p

    run = op_parser("run", "run an op, check it against the reference, time both")
    run.add_argument("--shape", type=_shape, help="input shape, e.g. 4096x7168 (default: the op's)")
    run.add_argument("--target", choices=TARGETS, default="cpu", help="where the kernel runs (default cpu)")
    run.add_argument("--min-time", type=_seconds, default=bench.MIN_RUN_TIME, metavar="S",
                     help=f"seconds of timed kernel calls, as vmi bench times (default {bench.MIN_RUN_TIME}); the "
                          f"reference is timed once")
    bench_parser = op_parser("bench", "the cpu kernel against the torch reference, a torch baseline and the "
                                      "machine's copy bandwidth")
    bench_parser.add_argument("--shape", type=_shape, help="one shape, e.g. 4096x7168 (default: the op's bench shapes)")
    bench_parser.add_argument("--min-time", type=_seconds, default=bench.MIN_RUN_TIME, metavar="S",
                              help=f"seconds of timed calls per measurement (torch.utils.benchmark's blocked "
                                   f"autorange; default {bench.MIN_RUN_TIME})")
    bench_parser.add_argument("--threads", type=_thread_counts, default=(1, 2), metavar="1,2",
                              help="thread counts to run (torch threads and VMI_CPU_THREADS), default 1,2")
    bench_parser.add_argument("--tokens", type=_thread_counts, metavar="1,16,...",
                              help="token counts to run at the hidden size of --shape (default: the op's); "
                                   "with --plot, default: the token counts of the op's bench shapes")
    bench_parser.add_argument("--overhead", action="store_true",
                              help="where one call's time goes (type checks, dispatcher, launch plan, kernels; "
                                   "the call without plans), 1 thread, at --tokens (default 1,4,16) or --shape")
    bench_parser.add_argument("--plot", type=Path, metavar="FILE.png",
                              help="also write a chart of GB/s by token count for the last thread count "
                                   "(kernel, reference, baseline, copy bandwidth; needs vmi-core[plot])")
    source = op_parser("source", "print the generated kernel source")
    source.add_argument("--target", choices=TARGETS, required=True, help="the target to lower for")
    source.add_argument("--stats", action="store_true",
                        help="Ascend only: vector regions, and per-element counts of one ascend-sim launch")
    source.add_argument("--shape", type=_shape, help="the shape --stats runs (default: the op's)")

    pre = sub.add_parser("precompile", help="compile the ops' kernels into the cache before serving")
    pre.add_argument("--family", help="only this family's ops (quant, mhc, moe)")
    pre.add_argument("--target", nargs="+", choices=TARGETS,
                     help="targets to compile for (default: this host's accelerator, else cpu)")
    pre.add_argument("--ops", nargs="+", metavar="OP", help="only these ops")
    pre.add_argument("--from-config", type=Path, metavar="FILE",
                     help="the op calls of a model: a JSON list of {\"op\": ..., \"options\": {...}} "
                          "(default: every op's default options)")
    pre.add_argument("-j", "--jobs", type=_positive, default=os.cpu_count() or 1,
                     help="worker processes (default: one per core)")

    cache = sub.add_parser("cache", help="the kernel cache: what it holds, and removing it")
    actions = cache.add_subparsers(dest="action", required=True)
    actions.add_parser("info", help="location, size, kernel variants by op and target")
    clear = actions.add_parser("clear", help="remove cached kernels (all, or those of --op / --target)")
    clear.add_argument("--op", nargs="+", default=[], help="only these ops' kernels")
    clear.add_argument("--target", nargs="+", default=[], choices=TARGETS, help="only kernels for these targets")
    clear.add_argument("--stale", action="store_true",
                       help="only the directories of other vmi versions or toolchains")
    clear.add_argument("--yes", action="store_true", help="remove without asking")
    sub.add_parser("demo", help="run an installed demo: vmi demo [NAME] [its options] (default: the block; "
                                "vmi demo NAME --help lists the options)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # A demo parses its own options; every other command takes only its declared ones.
    if args.command == "demo":
        args.demo_argv = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    ops = discover()
    handlers = {"list": cmd_list, "run": cmd_run, "bench": cmd_bench, "source": cmd_source,
                "precompile": cmd_precompile, "cache": cmd_cache, "demo": cmd_demo}
    try:
        return handlers[args.command](ops, args)
    except (UserError, ValueError, TypeError) as error:
        if args.debug:
            raise
        # The ops' argument checks raise ValueError/TypeError naming the argument.
        print(f"vmi: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`vmi list | head`): stop quietly, and keep Python's exit flush from
        # raising again on the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
