"""The expert-parallel block of ``vmi.block_ep`` on 2 and 4 ranks that torchrun starts (cpu,
gloo), forward and backward, against the single-process block.

Each test runs torchrun on this file, whose ``__main__`` is the ranks' work: every rank takes its
share of the scenarios' training steps and rank 0 saves the comparisons (``compare_with_single_process``)
for the test to check:

* the head output and the gradients of the input and of the experts' weights: bit for bit;
* the gradients of the replicated parameters, sums over tokens that the ranks take in parts: within
  the bounds of docs/block.md (a different order of fp32 sums; the bf16 RMSNorm weight's gradient is
  rounded once per rank);
* the uneven splits (a sequence cut between ranks at a point no divisor of the split gives) and the
  muted experts (a rank whose expert receives no row, a rank that receives none) happened.

Marked ``block`` and ``slow``: each torchrun start costs its ranks' imports and kernel loads, about
10 s per rank on two busy cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.block, pytest.mark.slow]

TORCHRUN = Path(sys.executable).with_name("torchrun")
VMI = Path(sys.executable).with_name("vmi")
NUM_EXPERTS = 8  # BlockConfig's default, which the scenarios keep
# name: (sequences, sequence length, logical experts whose gate bias mutes them)
SCENARIOS = {
    "even": (2, 32, ()),
    "uneven, expert 3 muted": (3, 21, (3,)),
    "uneven, experts 0 and 1 muted": (3, 22, (0, 1)),
}


def _torchrun(world_size: int, *args: str, timeout_s: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, VMI_CPU_THREADS="1", OMP_NUM_THREADS="1")
    start = time.monotonic()
    done = subprocess.run([str(TORCHRUN), f"--nproc-per-node={world_size}", "--standalone", *args],
                          capture_output=True, text=True, timeout=timeout_s, env=env)
    return done, time.monotonic() - start


def _comparisons(tmp_path, world_size: int, scenarios: list[str]) -> dict[str, dict]:
    out = tmp_path / "comparisons.pt"
    done, _ = _torchrun(world_size, __file__, "--out", str(out), *(arg for s in scenarios for arg in ("--scenario", s)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return torch.load(out)


def _rank_of_expert(expert: int, world_size: int) -> tuple[int, int]:
    """(rank, index among its experts) of a logical expert: physical slot E - 1 - e (docs/block.md)."""
    slot = NUM_EXPERTS - 1 - expert
    return divmod(slot, NUM_EXPERTS // world_size)


def check_comparison(result: dict, world_size: int, sequences: int, length: int, muted: tuple[int, ...]):
    from vmi.block import relative_error
    from vmi_core.tools.testing import assert_bitwise_equal

    tokens = sequences * length
    assert result["rank_tokens"] == [(r + 1) * tokens // world_size - r * tokens // world_size
                                     for r in range(world_size)]
    for expert in muted:
        rank, index = _rank_of_expert(expert, world_size)
        assert result["received_rows"][rank][index] == 0, (expert, result["received_rows"])
    assert sum(map(sum, result["received_rows"])) == tokens * 2  # top-2: every pair went somewhere

    assert_bitwise_equal(*result["head"], "head")
    for name in ("x", "w_up", "w_down"):
        assert_bitwise_equal(*result["gradients"][name], f"d {name}")
    # The same fp32 sums over tokens in another order (each rank's kernels sum their tokens, then
    # the ranks' parts are added): N terms (T·n·(n+2) ≈ 1600 at most, mHC's scales) differ by at
    # most 2·N·2^-24 ≈ 2^-12 of the terms' absolute sum; these gradients are not dominated by
    # cancellation (measured: 3.6e-6 at most): 2^-12 of the largest gradient.
    for name in ("mhc_fn", "mhc_scale", "mhc_base", "gate_weight", "head_fn", "head_scale", "head_base"):
        assert relative_error(*result["gradients"][name]) <= 2**-12, name
    # The RMSNorm weight's bf16 gradient: each rank's part is rounded to bf16 (2^-8 of it) before
    # the fp32 sum, which is rounded once (2^-8 of the result), and the single process's (2^-8);
    # the parts' order of fp32 sums adds far less than the 2^-6 margin.
    ep, single = (g.double() for g in result["gradients"]["norm_weight"])
    partial = result["partial_sums"]["norm_weight"].double()
    bound = 2**-8 * (partial + ep.abs() + single.abs()) * (1 + 2**-6)
    assert ((ep - single).abs() <= bound).all(), (ep - single).abs().max()
    for name in ("loss", "balance_loss"):
        assert relative_error(*map(torch.tensor, result[name])) <= 2**-12, name


def test_two_ranks(tmp_path):
    """An even split (one sequence per rank); 63 tokens in 3 sequences cut at token 31 (10 of
    sequence 1's 21 tokens on rank 0, 11 on rank 1: its balance statistics summed over both) with
    an expert that receives no row."""
    results = _comparisons(tmp_path, 2, ["even", "uneven, expert 3 muted"])
    for name, result in results.items():
        check_comparison(result, 2, *SCENARIOS[name])


def test_four_ranks(tmp_path):
    """66 tokens in 3 sequences of 22 on 4 ranks (16/17/16/17: every sequence across two ranks,
    ranks 1 and 2 holding parts of two), the experts of rank 3 muted: it receives no row, sends rows."""
    results = _comparisons(tmp_path, 4, ["uneven, experts 0 and 1 muted"])
    check_comparison(results["uneven, experts 0 and 1 muted"], 4, *SCENARIOS["uneven, experts 0 and 1 muted"])


def test_a_hung_rank_ends_the_run_with_an_error_naming_a_rank(tmp_path):
    """Rank 1 sleeps instead of joining the first collective: rank 0 waits out the process group's
    timeout (10 s), fails naming itself, and torchrun ends the run."""
    done, seconds = _torchrun(2, __file__, "--out", str(tmp_path / "none.pt"), "--scenario", "even",
                              "--hang-rank", "1", "--timeout", "10", timeout_s=120)
    assert done.returncode != 0
    assert "RankError: rank 0 of 2" in done.stderr, done.stderr[-4000:]
    assert seconds < 100


def test_an_error_on_a_rank_names_the_rank(monkeypatch):
    """A rank's exception comes out as ``RankError`` naming it (torchrun's environment of one rank)."""
    import socket

    from vmi.block_ep import RankError, on_each_rank

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        monkeypatch.setenv(name, value)

    def work(rank, world_size):
        raise ValueError("no experts here")

    with pytest.raises(RankError, match="^rank 0 of 1: ValueError: no experts here$"):
        on_each_rank(work, "cpu", timeout_s=10)


def test_demo_under_torchrun():
    """``vmi demo block --ep 2`` as docs/block.md runs it: torchrun, rank 0 prints."""
    done, _ = _torchrun(2, str(VMI), "demo", "block", "--ep", "2", "--repeat", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    for line in ("expert parallel: 2 ranks", "head output      bit for bit", "d x              bit for bit",
                 "time per training step"):
        assert line in done.stdout, (line, done.stdout)


def _rank_work(args) -> None:
    """Each rank's part of a test: the scenarios' comparisons, saved by rank 0."""
    import dataclasses

    from vmi.block import BlockConfig, Kernels, make_params
    from vmi.block_ep import compare_with_single_process, on_each_rank

    def work(rank: int, world_size: int) -> None:
        if rank == args.hang_rank:
            time.sleep(3600)
        results = {}
        for name in args.scenario:
            sequences, length, muted = SCENARIOS[name]
            c = BlockConfig(num_sequences=sequences, sequence_length=length)
            p = make_params(c, seed=0)
            p.gate_bias[list(muted)] = -10.0  # keys u + bias, u >= 0 of order 1: never in the top 2
            result = compare_with_single_process(Kernels("cpu"), p, c, rank, world_size, repeat=1)
            if result is not None:
                results[name] = dataclasses.asdict(result)
        if rank == 0:
            torch.save(results, args.out)

    torch.set_num_threads(1)
    on_each_rank(work, "cpu", args.timeout)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, required=True)
    parser.add_argument("--hang-rank", type=int)
    parser.add_argument("--timeout", type=float, default=200)
    _rank_work(parser.parse_args())
