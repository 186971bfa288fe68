"""``vmi demo`` (entry point ``block`` of the group ``vmi.demos``): the DeepSeek-V4-style block
forward and backward with the cpu kernels and with the references, a table of the time per stage,
and the block's error against float64. ``--ep N`` runs instead the expert-parallel training step on
the N ranks that torchrun starts (``torchrun --nproc-per-node N --standalone $(which vmi) demo block
--ep N``; without torchrun's environment the demo starts torchrun itself) and compares it with the
single-process block."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from vmi_core.environment import THREADS_ENV, refresh_environment

from .block import (
    BlockConfig,
    Kernels,
    StageTimer,
    float64_errors,
    gc_paused,
    make_params,
    relative_error,
    run_block,
)


@dataclass
class Timings:
    """Median seconds over the timed runs, per stage (forward, backward) and of the whole block."""

    order: list[str]
    forward: dict[str, float]
    backward: dict[str, float]
    total: float


def _timed_runs(ops: Kernels, c: BlockConfig, seed: int, repeat: int) -> Timings:
    """``repeat`` forward + backward runs with Python's garbage collector paused (as ``timeit``
    does); medians, so that a run the machine's other work interrupted does not count."""
    timers, totals = [], []
    for _ in range(repeat):
        p = make_params(c, seed).fresh()
        timer = StageTimer()
        with gc_paused():
            start = time.perf_counter()
            run_block(ops, p, c, timer).loss.backward()
            totals.append(time.perf_counter() - start)
        timers.append(timer)
    order = timers[0].order
    return Timings(order, {s: statistics.median(t.forward[s] for t in timers) for s in order},
                   {s: statistics.median(t.backward[s] for t in timers) for s in order}, statistics.median(totals))


def _print_table(kernel: Timings, reference: Timings) -> None:
    print(f"{'stage':28s} {'kernel ms':>10s} {'(fwd + bwd)':>16s} {'reference ms':>13s} {'share':>7s}")
    for stage in kernel.order:
        k_fwd, k_bwd = kernel.forward[stage], kernel.backward[stage]
        r_ms = (reference.forward[stage] + reference.backward[stage]) * 1e3
        split = f"{k_fwd * 1e3:.2f} + {k_bwd * 1e3:.2f}"
        print(f"{stage:28s} {(k_fwd + k_bwd) * 1e3:10.2f} {split:>16s} {r_ms:13.2f} "
              f"{(k_fwd + k_bwd) / kernel.total:7.1%}")
    k_other = kernel.total - sum(kernel.forward.values()) - sum(kernel.backward.values())
    r_other = reference.total - sum(reference.forward.values()) - sum(reference.backward.values())
    print(f"{'outside the stages':28s} {k_other * 1e3:10.2f} {'':16s} {r_other * 1e3:13.2f} "
          f"{k_other / kernel.total:7.1%}")
    print(f"{'block (forward + backward)':28s} {kernel.total * 1e3:10.2f} {'':16s} {reference.total * 1e3:13.2f}")
    print("(medians of the runs; share: of the kernel block's time)")


def _print_errors(label: str, errors: dict[str, float]) -> None:
    worst = max((name for name in errors if name != "head"), key=errors.get)
    print(f"  {label:10s} head {errors['head']:.2e}, gradients up to {errors[worst]:.2e} ({worst})")


def _print_comparison(result, c: BlockConfig) -> bool:
    """Print the expert-parallel step against the single-process block; True when the forward and the
    gradients the docs call bit for bit (the input's, the experts') are."""
    print(f"expert parallel: {result.world_size} rank{'s' if result.world_size > 1 else ''} (torch.distributed), "
          f"{c.num_sequences} sequences x {c.sequence_length} tokens, {c.num_experts} experts "
          f"({c.num_experts // result.world_size} per rank); tokens per rank "
          f"{'/'.join(map(str, result.rank_tokens))}")
    print("rows each rank's experts received: " + ", ".join(
        f"rank {rank} {rows}" for rank, rows in enumerate(result.received_rows)))
    print("against the single-process block (rank 0 runs it), forward and backward:")

    def agreement(ep, single) -> str:
        if torch.equal(ep.view(torch.uint8), single.view(torch.uint8)):
            return "bit for bit"
        diff = (ep.double() - single.double()).abs().max().item()
        return f"max diff {diff:.2e} ({relative_error(ep, single):.1e} of max |single|)"

    bitwise = {"head output": result.head} | {f"d {name}": pair for name, pair in result.gradients.items()}
    for name, (ep, single) in bitwise.items():
        print(f"  {name:16s} {agreement(ep, single)}")
    for name, (ep, single) in (("loss", result.loss), ("balance loss", result.balance_loss)):
        print(f"  {name:16s} {ep:.9g} (single process {single:.9g})")
    print(f"time per training step (forward, backward, gradient sum; median, barrier to barrier): "
          f"{result.step_seconds * 1e3:.1f} ms; the single-process block on rank 0: "
          f"{result.single_seconds * 1e3:.1f} ms")
    return all(agreement(*bitwise[name]) == "bit for bit" for name in ("head output", "d x", "d w_up", "d w_down"))


def _expert_parallel(args, argv: list[str]) -> int:
    """The ``--ep N`` run: on each rank under torchrun; otherwise start torchrun on this module."""
    if "RANK" not in os.environ:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ep}",
                   "-m", __spec__.name, *argv]
        return subprocess.run(command, check=False).returncode
    from .block_ep import compare_with_single_process, on_each_rank

    c = BlockConfig(num_sequences=args.sequences, sequence_length=args.sequence_length)

    def work(rank: int, world_size: int) -> int:
        if world_size != args.ep:
            raise ValueError(f"--ep {args.ep}, but torchrun started {world_size} ranks")
        result = compare_with_single_process(Kernels("cpu", args.flavor), make_params(c, args.seed), c, rank,
                                             world_size, args.repeat)
        return 0 if result is None or _print_comparison(result, c) else 1

    return on_each_rank(work, "cpu", args.timeout)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vmi demo block", description=" ".join(__doc__.split()))
    parser.add_argument("--seed", type=int, default=0, help="seed of the block's weights and inputs (default 0)")
    parser.add_argument("--flavor", choices=("ascend", "cuda"), default="ascend",
                        help="bit conventions of the cpu kernels and the references (default ascend)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each implementation (medians shown)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of torch and of the cpu kernels (default 1: stable timings on a busy machine)")
    parser.add_argument("--ep", type=int, metavar="N",
                        help="run the expert-parallel training step on N ranks (torchrun, one process each)")
    parser.add_argument("--sequences", type=int, default=BlockConfig.num_sequences,
                        help=f"sequences of the batch (default {BlockConfig.num_sequences})")
    parser.add_argument("--sequence-length", type=int, default=BlockConfig.sequence_length,
                        help=f"tokens per sequence (default {BlockConfig.sequence_length})")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a rank waits for the others in a collective before failing (default 300)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ[THREADS_ENV] = str(args.threads)
    refresh_environment()
    if args.ep is not None:
        return _expert_parallel(args, argv)
    c = BlockConfig(num_sequences=args.sequences, sequence_length=args.sequence_length)
    print(f"block: {c.num_sequences} sequences x {c.sequence_length} tokens, hidden {c.hidden}, mHC n = {c.mhc_mult}, "
          f"{c.num_experts} experts, top-{c.num_topk}, SwiGLU width {c.expert_hidden}; flavor {args.flavor}, "
          f"{args.threads} thread{'s' if args.threads > 1 else ''}")
    kernels, reference = Kernels("cpu", args.flavor), Kernels("torch", args.flavor)
    start = time.perf_counter()
    run_block(kernels, make_params(c, args.seed).fresh(), c).loss.backward()
    print(f"first run (compiles the kernels not yet in the cache): {time.perf_counter() - start:.1f} s\n")
    _print_table(_timed_runs(kernels, c, args.seed, args.repeat), _timed_runs(reference, c, args.seed, args.repeat))

    print("\nmax error against the float64 block (max |x - exact| / max |exact|; E4M3 casts in both):")
    for ops in (kernels, reference):
        p = make_params(c, args.seed).fresh()
        run = run_block(ops, p, c)
        run.loss.backward()
        _print_errors(ops.name.split(" ")[0], float64_errors(run, p, c))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
