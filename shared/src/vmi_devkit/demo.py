"""``vmi demo`` (entry point ``block`` of the group ``vmi.demos``): the DeepSeek-V4-style block of
``vmi_devkit.block`` forward and backward with the cpu kernels and with the references, a table of
the time per stage, and the block's error against float64; ``--ep 2`` also runs the 2-rank
expert-parallel forward and compares it with the single-process one."""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from dataclasses import dataclass

import torch

from vmi_core.cpu_parallel import THREADS_ENV

from .block import BlockConfig, Kernels, StageTimer, float64_errors, make_params, run_block


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
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            run_block(ops, p, c, timer).loss.backward()
            totals.append(time.perf_counter() - start)
        finally:
            gc.enable()
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vmi demo block", description=" ".join(__doc__.split()))
    parser.add_argument("--seed", type=int, default=0, help="seed of the block's weights and inputs (default 0)")
    parser.add_argument("--flavor", choices=("ascend", "cuda"), default="ascend",
                        help="bit conventions of the cpu kernels and the references (default ascend)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each implementation (medians shown)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of torch and of the cpu kernels (default 1: stable timings on a busy machine)")
    parser.add_argument("--ep", type=int, choices=(1, 2), default=1,
                        help="2: also the 2-rank expert-parallel forward (gloo, two local processes)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ[THREADS_ENV] = str(args.threads)
    c = BlockConfig()
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

    if args.ep == 2:
        from .block_ep import run_expert_parallel

        result = run_expert_parallel(c, args.seed, "cpu", args.flavor)
        same = torch.equal(result["expert_parallel"].view(torch.int16), result["single"].view(torch.int16))
        diff = (result["expert_parallel"].float() - result["single"].float()).abs().max().item()
        print(f"\nexpert parallel (2 ranks, gloo, forward): {'bit for bit' if same else f'max diff {diff:.3e} from'} "
              f"the single-process block; rank 0's forward {result['seconds'] * 1e3:.1f} ms")
        return 0 if same else 1
    return 0
