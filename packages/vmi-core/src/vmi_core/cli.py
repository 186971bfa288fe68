"""The ``vmi`` command: list, run, benchmark and show the source of vmi's ops.

    vmi list
    vmi run OP [--shape 4096x7168] [--target cpu|ascend-sim|...] [--flavor ascend] [-o name=value ...]
    vmi bench OP [--shape ...] [--repeat N] [-o name=value ...]
    vmi source OP --target ascend|cuda|cpu [-o name=value ...]
    vmi source OP --target ascend --stats [--shape ...] [-o name=value ...]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import torch

from .registry import OpInfo, discover
from .targets import FLAVORS, TARGETS, device_of, flavor_argument, resolve_flavor


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


def _timed(fn, repeat: int) -> tuple[object, float]:
    """The result of ``fn()`` and its median wall time in seconds over ``repeat`` runs after one warm-up."""
    result = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def _op(ops: dict[str, OpInfo], name: str) -> OpInfo:
    if name not in ops:
        raise UserError(f"unknown op {name!r}; installed ops: {', '.join(sorted(ops)) or 'none'}")
    return ops[name]


def cmd_list(ops: dict[str, OpInfo], args) -> int:
    unique = sorted({op.name: op for op in ops.values()}.values(), key=lambda op: (op.family, op.name))
    if not unique:
        print("no ops installed (install vmi-quant, vmi-mhc or vmi-moe)")
        return 0
    width = max(len(op.name) for op in unique)
    for op in unique:
        print(f"{op.name:<{width}}  [{op.family}] {op.summary}")
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
    # ascend, ascend-sim and cuda run their own flavor: the reference must use it too.
    flavor = resolve_flavor(target, flavor_argument(target, args.flavor)).name
    inputs = op.make_inputs(shape, options, args.seed)
    if device_of(target) != "cpu":
        print(f"note: target {target!r} needs its device; the inputs are moved there")
    start = time.perf_counter()
    outputs = op.run(inputs, options, target, flavor)
    first = time.perf_counter() - start
    _, kernel_s = _timed(lambda: op.run(inputs, options, target, flavor), args.repeat)
    expected, ref_s = _timed(lambda: op.reference(inputs, options, flavor), args.repeat)
    mismatches = op.check(outputs, expected)
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    print(f"{op.name} shape={'x'.join(map(str, shape))} target={target} flavor={flavor} {shown}")
    print(f"  first call (includes compile or cache load): {first * 1e3:.1f} ms")
    print(f"  kernel {kernel_s * 1e3:.3f} ms, torch reference {ref_s * 1e3:.3f} ms, "
          f"speed-up x{ref_s / kernel_s:.2f}")
    if mismatches:
        print("  MISMATCH against the reference:")
        print("\n".join(mismatches))
        return 1
    print(f"  matches the reference {op.check_criterion}")
    return 0


def cmd_bench(ops, args) -> int:
    op = _op(ops, args.op)
    options = op.parse_options(args.opt)
    shapes = [args.shape] if args.shape else list(op.bench_shapes)
    for shape in shapes:
        _check_shape(op, shape)
    print(f"{op.name} on cpu vs its torch reference ({torch.get_num_threads()} torch threads), "
          f"options: {', '.join(f'{k}={v}' for k, v in options.items())}")
    print(f"{'shape':>14} {'kernel GB/s':>12} {'torch GB/s':>11} {'ratio':>7}")
    for shape in shapes:
        inputs = op.make_inputs(shape, options, args.seed)
        outputs, kernel_s = _timed(lambda inputs=inputs: op.run(inputs, options, "cpu", args.flavor), args.repeat)
        expected, ref_s = _timed(lambda inputs=inputs: op.reference(inputs, options, args.flavor), args.repeat)
        status = "" if not op.check(outputs, expected) else "  (MISMATCH)"
        nbytes = op.nbytes(inputs, outputs)
        print(f"{'x'.join(map(str, shape)):>14} {nbytes / kernel_s / 1e9:>12.3f} {nbytes / ref_s / 1e9:>11.3f} "
              f"{ref_s / kernel_s:>7.2f}{status}")
    return 0


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
    from .ascend_sim import last_launch_stats
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vmi", description="vmi kernel library: list, run, bench, source")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="ops and their status per target")

    def op_parser(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("op")
        p.add_argument("-o", "--opt", action="append", default=[], metavar="NAME=VALUE",
                       help="an op option, e.g. -o fmt=e2m1 -o num_per_channels=16")
        p.add_argument("--flavor", choices=FLAVORS, default="ascend",
                       help="bit conventions (cpu runs either; ascend/cuda use their own)")
        p.add_argument("--seed", type=int, default=0)
        return p

    run = op_parser("run", "run an op, check it against the reference, time both")
    run.add_argument("--shape", type=_shape)
    run.add_argument("--target", choices=TARGETS, default="cpu")
    run.add_argument("--repeat", type=_positive, default=3)
    bench = op_parser("bench", "throughput of the cpu kernel and the torch reference")
    bench.add_argument("--shape", type=_shape)
    bench.add_argument("--repeat", type=_positive, default=10)
    source = op_parser("source", "print the generated kernel source")
    source.add_argument("--target", choices=TARGETS, required=True)
    source.add_argument("--stats", action="store_true",
                        help="Ascend only: vector regions, and per-element counts of one ascend-sim launch")
    source.add_argument("--shape", type=_shape, help="the shape --stats runs (default: the op's)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ops = discover()
    # Compile progress is TileLang's INFO chatter; the command prints its own results. After
    # discover(): importing the ops imports TileLang, which sets up its own logger levels.
    for name in ("tilelang", "tilelang.jit.kernel"):
        logging.getLogger(name).setLevel(logging.WARNING)
    handlers = {"list": cmd_list, "run": cmd_run, "bench": cmd_bench, "source": cmd_source}
    try:
        return handlers[args.command](ops, args)
    except (UserError, ValueError, TypeError) as error:
        # The ops' argument checks raise ValueError/TypeError naming the argument.
        print(f"vmi: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
