"""normalize_weight on the cpu target (both flavors) and on ascend-sim (the ascend flavor, its only
one) against the reference, bit for bit.

Denominators and normalised weights are compared with ``assert_bitwise_equal`` (dtype,
shape, strides, bits): the sum order is the flavor's (ascend left to right, cuda the
32-lane xor butterfly) and every quotient is one correctly rounded division, so there is
no tolerance. Independently of the reference: the spec's summation example (§9.3) by bit
pattern, quotients against fp64 division rounded once (exact for fp32 operands), all-zero
rows (``D = 1e-20``, weights +0.0), negative weights, signed zeros and quotients that
overflow. Row counts cover the empty input, one row, both sides of the 128-row work tile,
several tiles and rows split over cpu threads. One kernel per ``(K, flavor)``.

On ascend-sim (the emitted AscendC on vmi-core's model of the vector core) the same checks
run (the K = 6 order check in the slow run only), the reference comparison with two more row
counts, of more than two work tiles per simulated core (``moe_cases.wrapping_counts``), the
pipe schedule cycling over ``SIM_SCHEDULES`` from one row count to the next.
"""

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV, row_ranges
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_cases import FLAVORS, counts_on, flavor_targets
from vmi_moe import normalize_weight, normalize_weight_parallel
from vmi_moe.kernels.normalize_weight import BLOCK_M
from vmi_moe.reference import normalize_weight as reference_normalize

# K = 1, the gate's 6 and 8, 9 (butterfly lanes past 8), 32 (a full warp).
TOPKS = [1, 6, 8, 9, 32]
ROWS = [0, 1, 127, 128, 129, 300]
EPS_BITS = 0x1E3CE508  # fp32(1e-20)


def weights_for(num_rows: int, k: int, seed: int) -> torch.Tensor:
    """Uniform weights with a few all-zero rows, zero entries and rows spanning many binades."""
    g = generator(seed)
    w = torch.rand(num_rows, k, generator=g)
    if num_rows:
        w[::11] = 0.0
        w[torch.rand(num_rows, k, generator=g) < 0.05] = 0.0
        spread = torch.exp2(torch.randint(-60, 60, (num_rows, k), generator=g).float())
        w[3::7] = (w * spread)[3::7]
        # One weight near 1, the others spread down to the subnormal range: subnormal quotients.
        tiny = torch.rand(num_rows, k, generator=g) * torch.exp2(torch.randint(-149, -110, (num_rows, k),
                                                                                generator=g).float())
        tiny[:, 0] = 1.0 + torch.rand(num_rows, generator=g)
        w[5::13] = tiny[5::13]
    return w.contiguous()


def check_against_reference(w: torch.Tensor, flavor: str, what: str,
                            target: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    d, n = normalize_weight(w, target=target, flavor=flavor)
    ref_d, ref_n = reference_normalize(w, flavor)
    assert_bitwise_equal(d, ref_d, f"{what} denominator")
    assert_bitwise_equal(n, ref_n, f"{what} weights")
    return d, n


# Every K on cpu; on ascend-sim (a kernel build each) K = 9 by default, the others in the slow run.
MATCH_CASES = [pytest.param(flavor, target, K, id=f"{flavor}-{target}-{K}",
                            marks=[pytest.mark.slow] if target != "cpu" and K != 9 else [])
               for K in TOPKS for flavor, target in flavor_targets()]


@pytest.mark.parametrize(("flavor", "target", "K"), MATCH_CASES)
def test_matches_reference(flavor: str, target: str, K: int) -> None:
    for seed, T in enumerate(counts_on(target, ROWS, BLOCK_M)):
        w = weights_for(T, K, seed)
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):  # ascend-sim launches only
            d, n = check_against_reference(w, flavor, f"T={T}", target)
        if T:
            # Quotients: fp64 division of fp32 operands rounded to fp32 is the correctly rounded quotient.
            assert_bitwise_equal(n, (w.double() / d.double()[:, None]).float(), f"T={T} quotients")
            zero = (w == 0).all(dim=1)
            assert bool((d[zero].view(torch.int32) == EPS_BITS).all()), "all-zero rows: D = 1e-20"
            assert bool((n[zero].view(torch.int32) == 0).all()), "all-zero rows: +0.0 weights"


SUM_BITS = {"ascend": 0x40066666, "cuda": 0x40066667}


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_summation_order_example(flavor: str, target: str) -> None:
    """Spec §9.3: [0.1, ..., 0.6] sums to 2.1 left to right and one ulp more in butterfly order."""
    w = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    d, _ = check_against_reference(w, flavor, "example", target)
    assert int(d.view(torch.int32)[0]) == SUM_BITS[flavor]


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_butterfly_order_k6(flavor: str, target: str) -> None:
    """K = 6: cuda adds ((w0 + w4) + w2) + ((w1 + w5) + w3), ascend left to right (spec §4.2)."""
    w = weights_for(200, 6, 5)
    d, _ = normalize_weight(w, target=target, flavor=flavor)
    c = [w[:, j] for j in range(6)]
    total = (((c[0] + c[4]) + c[2]) + ((c[1] + c[5]) + c[3])) if flavor == "cuda" else \
        ((((c[0] + c[1]) + c[2]) + c[3]) + c[4]) + c[5]
    assert_bitwise_equal(d, total + torch.tensor(1e-20), "denominator")


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_subnormal_quotient_ties(flavor: str, target: str) -> None:
    """D = 2 exactly and weights k * 2^-149: the quotients k * 2^-150 are exact ties between subnormals
    for odd k and round to even: 0, 2, 2, 4 (times 2^-149)."""
    tiny = 2.0**-149
    w = torch.tensor([[1.0, 1.0, tiny, 3 * tiny, 5 * tiny, 7 * tiny]])
    d, n = check_against_reference(w, flavor, "ties", target)
    assert float(d[0]) == 2.0
    assert_bitwise_equal(n, torch.tensor([[0.5, 0.5, 0.0, 2 * tiny, 2 * tiny, 4 * tiny]]), "round to even")


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_subnormal_quotients_near_ties_of_both_signs(flavor: str, target: str) -> None:
    """Quotients just above and below midpoints of the subnormal grid, and exactly on them, with a
    negative denominator too: the rounding must follow the exact quotient (on Ascend vector lanes it
    comes from a residual's sign, the vector division flushing subnormals)."""
    tiny = 2.0**-149
    rows = []
    for sign in (1.0, -1.0):
        for k in (1, 3, 5, 7):
            for nudge in (-1, 0, 1):
                # D = 3 * 2^20 (exact); w / D = (k + nudge * 2^-20 / 3 ...) * 2^-150 around the midpoint k.
                w_tie = k * tiny * 3 * 2.0**19 + nudge * tiny
                rows.append([sign * 3.0 * 2.0**20 - sign * w_tie, sign * w_tie])
    w = torch.tensor(rows, dtype=torch.float64).float()
    check_against_reference(w, flavor, "near ties", target)


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_negative_weights(flavor: str, target: str) -> None:
    g = generator(6)
    w = (torch.rand(300, 8, generator=g) - 0.3) * 4.0
    d, n = check_against_reference(w, flavor, "negative", target)
    assert_bitwise_equal(n, (w.double() / d.double()[:, None]).float(), "quotients")


@pytest.mark.parametrize(("flavor", "target"), flavor_targets(sim_slow=True))
def test_signed_zero_and_overflowing_quotients(flavor: str, target: str) -> None:
    """Quotients -0.0 (w = -0.0; w = +0.0 over a negative D; a negative underflow) and +-inf (a sum that
    cancels) must be the IEEE quotients, as for any other weight."""
    w = torch.tensor([[-0.0, 1.0, 0.0],
                      [0.0, -1.0, 0.0],
                      [-(2.0**-149), 10.0, 0.0],
                      [1e30, -1e30, 1e-10]])
    d, n = check_against_reference(w, flavor, "edge", target)
    expected = torch.tensor([[-0.0, 1.0, 0.0],
                             [-0.0, 1.0, -0.0],
                             [-0.0, 1.0, 0.0],
                             [float("inf"), float("-inf"), 1.0]])
    if flavor == "cuda":
        # cuda: ((w0 + w2) + w1): 1e30 + 1e-10 rounds to 1e30, so D = 1e-20 and w2 / D = 1e10.
        expected[3, 2] = float(torch.tensor(1e-10) / torch.tensor(1e-20))
    assert_bitwise_equal(n, expected, "IEEE quotients")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_rows_split_over_threads(flavor: str, vmi_env) -> None:
    vmi_env.setenv(THREADS_ENV, "3")
    T = 2500
    assert len(row_ranges(T, 3, BLOCK_M, 4 * BLOCK_M)) >= 2
    w = weights_for(T, 8, 9)
    d, n = check_against_reference(w, flavor, "split")
    vmi_env.setenv(THREADS_ENV, "1")
    d1, n1 = normalize_weight(w, target="cpu", flavor=flavor)
    assert_bitwise_equal(d1, d, "one thread")
    assert_bitwise_equal(n1, n, "one thread")


def test_entry_points_agree() -> None:
    w = weights_for(300, 6, 10)
    d, n = normalize_weight(w, target="cpu")
    for what, (d2, n2) in {"second run": normalize_weight(w, target="cpu"),
                           "ascend flavor": normalize_weight(w, target="cpu", flavor="ascend"),
                           "parallel": normalize_weight_parallel(w, target="cpu"),
                           "torch": normalize_weight(w, target="torch")}.items():
        assert_bitwise_equal(d2, d, what)
        assert_bitwise_equal(n2, n, what)
    assert_bitwise_equal(w, weights_for(300, 6, 10), "input unchanged")


@pytest.mark.slow
@pytest.mark.parametrize("K", range(1, 33))
@pytest.mark.parametrize("flavor", FLAVORS)
def test_matches_reference_full(flavor: str, K: int) -> None:
    for seed, T in enumerate([4001, 16384]):
        check_against_reference(weights_for(T, K, 200 + seed), flavor, f"T={T}")
