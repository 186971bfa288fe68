"""topk_gate on the cpu and ascend-sim targets against the reference ``stable_topk``, bit for bit.

Indices are compared with ``assert_bitwise_equal`` (dtype int64, shape ``[T, K]``, strides
``(K, 1)``). The data mix normal samples with constructed ties (all-equal rows, equal maxima
at columns 31/32 and 63/64, integer rows), signed zeros, subnormals and the largest finite
values; token counts cover the empty input, one token, 33, one token past a work tile
(``TopkGateSpec.block_m`` rows), several tiles with a tail, and rows split over cpu
threads. The rank order of the tie rows is also checked against indices written down from
the rule (descending, ties to the lower index), and the spec's worked example (§9.1)
literally. One kernel is compiled per ``(E, K)``; the flavor does not change a bit, which
is checked too.

On ascend-sim (the emitted AscendC on vmi-core's model of the vector core) the comparison
runs on every size, with the token counts above plus two with more than two work tiles per
simulated core (``moe_cases.wrapping_counts``), the pipe schedule cycling over
``SIM_SCHEDULES`` from one token count to the next; the tie-rule check runs there in the
slow run.
"""

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, row_ranges
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_cases import SIM, TARGETS, TIE_KINDS, counts_on, tie_expectations, token_counts, with_ties
from vmi_moe import topk_gate, topk_gate_parallel
from vmi_moe.kernels.topk_gate import TopkGateSpec
from vmi_moe.reference import stable_topk

# (E, K): the largest gate width, the widest resident row (16-row tiles), E not a multiple of
# 8 or 32, K = 1 and K = 32.
SIZES = [(256, 8), (384, 6), (72, 6), (36, 1), (36, 32)]
# The v1 test matrix (spec §3.7) plus the widths above.
FULL_SIZES = [(72, 6), (32, 6), (64, 6), (96, 6), (16, 6), (36, 6), (108, 6), (128, 6), (144, 6), (256, 8),
              (384, 8), (500, 32), (33, 32), (1, 1)]

F32_MAX = 3.4028234663852886e38
SPECIALS = [0.0, -0.0, 2.0**-149, -2.0**-149, 2.0**-148, 1.1754942e-38, -F32_MAX, F32_MAX, 1e30, -1e30]


def scores_for(num_tokens: int, num_experts: int, seed: int) -> torch.Tensor:
    """Normal samples with tie rows and a sprinkling of special finite values."""
    g = generator(seed)
    x = with_ties(torch.randn(num_tokens, num_experts, generator=g), seed + 1)
    if x.numel():
        pick = torch.rand(x.shape, generator=g) < 0.02
        specials = torch.tensor(SPECIALS)[torch.randint(len(SPECIALS), x.shape, generator=g)]
        x = torch.where(pick, specials, x)
    return x.contiguous()


def on_targets(sizes: list[tuple[int, int]], *, sim_slow: bool = False) -> list:
    """``(E, K, target)`` for every size on both targets; ``sim_slow``: the ascend-sim ones only in the slow run."""
    return [pytest.param(e, k, target, id=f"E{e}-K{k}-{target}",
                         marks=[pytest.mark.slow] if sim_slow and target == SIM else [])
            for target in TARGETS for e, k in sizes]


@pytest.mark.parametrize(("E", "K", "target"), on_targets(SIZES))
def test_matches_reference(E: int, K: int, target: str) -> None:
    block_m = TopkGateSpec(E, K).block_m
    for seed, T in enumerate(counts_on(target, token_counts(block_m), block_m)):
        x = scores_for(T, E, seed)
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):  # ascend-sim launches only
            idx = topk_gate(x, K, target=target)
        assert_bitwise_equal(idx, stable_topk(x, K), f"T={T}")


@pytest.mark.parametrize(("E", "K", "target"), on_targets([(72, 6), (256, 8), (36, 32)], sim_slow=True))
def test_tie_rows_follow_the_rule(E: int, K: int, target: str) -> None:
    """Tie rows against leading indices written down from the rule, not from the reference."""
    x = with_ties(torch.randn(5 * TIE_KINDS, E, generator=generator(3)), 4, every=1)
    idx = topk_gate(x, K, target=target)
    expect = tie_expectations(E, K)
    for t in range(x.shape[0]):
        kind = t % TIE_KINDS
        if kind in expect:
            lead = expect[kind]
            assert idx[t, :len(lead)].tolist() == lead, f"row {t} (tie kind {kind})"
        assert idx[t].unique().numel() == K, f"row {t}: an index was taken twice"
    # Ties at the top straddling the K-th position: the tied columns, in increasing order.
    for t in range(1, x.shape[0], TIE_KINDS):
        tied = (x[t] == x[t].max()).nonzero().reshape(-1).tolist()
        n = min(len(tied), K)
        assert idx[t, :n].tolist() == tied[:n], f"row {t}"


@pytest.mark.parametrize(("K", "expected"), [(4, [1, 2, 4, 5]), (5, [1, 2, 4, 5, 0])])
def test_worked_example(K: int, expected: list[int]) -> None:
    x = torch.tensor([[2.0, 7.5, 7.5, -1.0, 7.5, 7.5]])
    assert topk_gate(x, K, target="cpu").tolist() == [expected]


def test_signed_zeros_subnormals_and_extremes() -> None:
    """-0.0 ties +0.0 (lower index first); subnormals and +-FLT_MAX order as values."""
    x = torch.tensor([[-0.0, 0.0, -2.0**-149, 2.0**-149, 2.0**-148, -F32_MAX, F32_MAX, -0.0, 0.0, 1.0, -1.0, 0.0]])
    idx = topk_gate(x, 11, target="cpu")
    assert idx.tolist() == [[6, 9, 4, 3, 0, 1, 7, 8, 11, 2, 10]]
    assert_bitwise_equal(idx, stable_topk(x, 11))


def test_rows_split_over_threads(vmi_env) -> None:
    vmi_env.setenv(THREADS_ENV, "3")
    E, K, T = 72, 6, 1000
    assert len(row_ranges(T, 3, TopkGateSpec(E, K).block_m, 256)) >= 2
    x = scores_for(T, E, 7)
    idx = topk_gate(x, K, target="cpu")
    assert_bitwise_equal(idx, stable_topk(x, K))
    vmi_env.setenv(THREADS_ENV, "1")
    assert_bitwise_equal(topk_gate(x, K, target="cpu"), idx, "one thread")


def test_entry_points_and_flavors_agree() -> None:
    x = scores_for(300, 72, 8)
    first = topk_gate(x, 6, target="cpu", flavor="ascend")
    assert_bitwise_equal(topk_gate(x, 6, target="cpu", flavor="ascend"), first, "second run")
    assert_bitwise_equal(topk_gate(x, 6, target="cpu", flavor="cuda"), first, "cuda flavor")
    assert_bitwise_equal(topk_gate_parallel(x, 6, target="cpu"), first, "topk_gate_parallel")
    assert_bitwise_equal(topk_gate(x, 6, target="torch"), first, "target torch")
    # The input is left unchanged (the kernel overwrites its on-chip copy only).
    assert_bitwise_equal(x, scores_for(300, 72, 8), "scores input")


@pytest.mark.slow
@pytest.mark.parametrize(("E", "K"), FULL_SIZES, ids=[f"E{e}-K{k}" for e, k in FULL_SIZES])
def test_matches_reference_full(E: int, K: int) -> None:
    for seed, T in enumerate([4001, 16384]):
        x = scores_for(T, E, 100 + seed)
        assert_bitwise_equal(topk_gate(x, K, target="cpu"), stable_topk(x, K), f"T={T}")
