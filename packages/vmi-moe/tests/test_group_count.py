"""group_count and aux_fi on the cpu target (both flavors) and on ascend-sim against the references,
bit for bit, and against their definitions directly.

Every output is compared with ``assert_bitwise_equal`` (dtype, shape, strides, bits). Independently
of the references: the counts from Python's ``Counter``, and ``aux_fi``'s bits from Python integers
rounded to fp32 once by ``struct`` (``fl(count * E)``, ``fl(T * k)``; their quotient in double
precision rounded to fp32 is the correctly rounded fp32 quotient, double rounding being innocuous
for a division at 53 >= 2 * 24 + 2 bits), on routings where the products are rounded, exactly on
midpoints of the fp32 grid (ties to even) included. Token counts cover the empty batch, one token,
both sides of a work tile and several tiles split over cpu threads; routings with unused slots,
repeats within a token, every entry on one id, and every entry unused. The sum kernel alone runs on
a table of several DMA chunks (buffer reuse, under both reuse schedules of ascend-sim). Errors: each
bad argument before any kernel runs, and ids outside ``[-1, E)`` after it.
"""

import struct
from collections import Counter

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV
from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_core.tools.testing import REUSE_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_cases import id_routing
from vmi_devkit.cuda import check_cuda_source
from vmi_moe.kernels import group_count as kernels
from vmi_moe.kernels.group_count import COUNTS, FREQUENCIES, SUM_ROWS, CountSumSpec, build_count_sum, count_spec
from vmi_moe.ops.aux_fi import AUX_FI, aux_fi, aux_fi_parallel
from vmi_moe.ops.group_count import GROUP_COUNT, group_count, group_count_parallel
from vmi_moe.reference import counts as reference

# (E, K): E one sum tile (72) and two, the second partial (200); both multiples of 8 only in part.
SIZES = [(72, 6), (200, 8)]
BLOCK_M = count_spec(72, 6).block_m


def f32(value: float) -> float:
    """``value`` rounded to fp32 (nearest, ties to even), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def defined_counts(idx: torch.Tensor, num_ids: int) -> torch.Tensor:
    tally = Counter(idx.flatten().tolist())
    return torch.tensor([tally[g] for g in range(num_ids)], dtype=torch.int32)


def defined_fi(counts: list[int], num_experts: int, num_tokens: int, num_aux_topk: int) -> torch.Tensor:
    """``aux_fi`` from Python integers: each product exact (below 2^53, so ``float`` keeps it), rounded
    to fp32 once, then the fp32 quotient; zeros for an empty batch."""
    if num_tokens == 0:
        return torch.zeros(num_experts, dtype=torch.float32)
    divisor = f32(float(num_tokens * num_aux_topk))
    return torch.tensor([f32(f32(float(c * num_experts)) / divisor) for c in counts], dtype=torch.float32)


def check_both(idx: torch.Tensor, num_ids: int, num_aux_topk: int, what: str, expected_counts=None,
               **where) -> None:
    """Both ops on ``idx`` against the references and the definitions (``expected_counts``, else
    ``defined_counts``), bit for bit."""
    counts = group_count(idx, num_ids, **where)
    if expected_counts is None:
        expected_counts = defined_counts(idx, num_ids)
    assert_bitwise_equal(counts, reference.group_count(idx, num_ids), f"{what} counts vs reference")
    assert_bitwise_equal(counts, expected_counts, f"{what} counts vs definition")
    fi = aux_fi(idx, num_ids, num_aux_topk, **where)
    assert_bitwise_equal(fi, reference.aux_fi(idx, num_ids, num_aux_topk), f"{what} fi vs reference")
    assert_bitwise_equal(fi, defined_fi(expected_counts.tolist(), num_ids, idx.shape[0], num_aux_topk),
                         f"{what} fi vs definition")


@pytest.mark.parametrize(("num_ids", "num_topk"), SIZES)
@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_matches_reference_and_definition(num_ids, num_topk, flavor):
    for num_tokens in (0, 1, BLOCK_M - 1, BLOCK_M + 1, 3 * BLOCK_M + 5):
        for kind in ("random", "repeats"):
            idx = id_routing(num_tokens, num_ids, num_topk, num_tokens + num_ids, kind)
            for num_aux_topk in (1, num_topk):
                check_both(idx, num_ids, num_aux_topk, f"E={num_ids} K={num_topk} T={num_tokens} {kind} "
                           f"k={num_aux_topk} {flavor}", target="cpu", flavor=flavor)


@pytest.mark.parametrize("kind", ["one id", "unused"])
def test_degenerate_routings(kind):
    idx = id_routing(2 * BLOCK_M + 3, 72, 6, 0, kind)
    for flavor in ("ascend", "cuda"):
        check_both(idx, 72, 6, f"{kind} {flavor}", target="cpu", flavor=flavor)
    counts = group_count(idx, 72, target="cpu")
    assert counts.sum() == (idx.numel() if kind == "one id" else 0)
    if kind == "unused":
        assert (aux_fi(idx, 72, 6, target="cpu").view(torch.int32) == 0).all()  # +0.0, not NaN


def test_empty_batch_gives_zeros_not_nan():
    for target in ("cpu", "torch"):
        fi = aux_fi(torch.empty(0, 6, dtype=torch.int64), 72, 6, target=target)
        assert_bitwise_equal(fi, torch.zeros(72), f"{target} fi")
        assert_bitwise_equal(group_count(torch.empty(0, 6, dtype=torch.int64), 72, target=target),
                             torch.zeros(72, dtype=torch.int32), f"{target} counts")


def test_rounded_products_and_ties():
    """Products past 2^24, rounded by their one conversion to fp32: numerators and divisors exactly on
    midpoints of the fp32 grid, to the even neighbour above and below (truncation or rounding half
    away from zero would pick another), and a divisor far past 2^24."""
    num_tokens = 310690
    # Grid step 16 in [2^27, 2^28): a midpoint is 8 (mod 16); the even neighbour lies above at 24
    # (mod 32), below at 8 (mod 32).
    up, down = (6 * num_tokens - 1) * 72, (6 * num_tokens - 3) * 72
    assert all(2**27 <= n < 2**28 for n in (up, down, 444 * num_tokens, 436 * num_tokens))
    assert (up % 32, down % 32, 444 * num_tokens % 32, 436 * num_tokens % 32) == (24, 8, 24, 8)
    assert f32(float(up)) == up + 8 and f32(float(down)) == down - 8
    # (entries of expert 0 left unused, num_aux_topk): every tie of the numerator and the divisor.
    for unused, num_aux_topk in ((1, 444), (3, 436), (1, 2**31 - 1)):
        idx = torch.zeros(num_tokens, 6, dtype=torch.int64)
        idx[0, :unused] = -1
        expected = torch.zeros(72, dtype=torch.int32)
        expected[0] = 6 * num_tokens - unused
        check_both(idx, 72, num_aux_topk, f"unused={unused} k={num_aux_topk}", expected, target="cpu")


def test_counts_do_not_depend_on_cpu_threads(vmi_env):
    idx = id_routing(8 * BLOCK_M + 9, 72, 6, 2, "repeats")
    results = {}
    for threads in ("1", "2", "3"):
        vmi_env.setenv(THREADS_ENV, threads)
        results[threads] = (group_count(idx, 72, target="cpu"), aux_fi(idx, 72, 6, target="cpu"))
    for threads in ("2", "3"):
        for a, b in zip(results["1"], results[threads], strict=True):
            assert_bitwise_equal(b, a, f"{threads} threads")
    check_both(idx, 72, 6, "threads", target="cpu")


def test_repeat_calls_run_from_a_plan_that_checks_the_ids_again():
    idx = id_routing(BLOCK_M + 3, 72, 6, 9)
    wanted = (reference.group_count(idx, 72), reference.aux_fi(idx, 72, 6))
    for _ in range(3):
        assert_bitwise_equal(group_count(idx, 72, target="cpu"), wanted[0], "planned counts")
        assert_bitwise_equal(aux_fi(idx, 72, 6, target="cpu"), wanted[1], "planned fi")
    for op, args in ((GROUP_COUNT, (idx, 72)), (AUX_FI, (idx, 72, 6))):
        plan = op.plan_of(*args, target="cpu")
        assert not isinstance(plan, str), plan
    bad = idx.clone()
    bad[3, 1] = 72
    for _ in range(2):
        with pytest.raises(ValueError, match="group_idx holds ids outside"):
            group_count(bad, 72, target="cpu")
        with pytest.raises(ValueError, match="topk_idx holds ids outside"):
            aux_fi(bad, 72, 6, target="cpu")


@pytest.mark.parametrize("num_tokens", [0, 1, BLOCK_M + 1])
def test_ascend_sim(num_tokens):
    idx = id_routing(num_tokens, 72, 6, num_tokens, "repeats" if num_tokens == 1 else "random")
    check_both(idx, 72, 6, f"ascend-sim T={num_tokens}", target="ascend-sim")
    assert_bitwise_equal(group_count_parallel(idx, 72, target="ascend-sim"), reference.group_count(idx, 72))
    assert_bitwise_equal(aux_fi_parallel(idx, 72, 1, target="ascend-sim"), reference.aux_fi(idx, 72, 1))


def crafted_table(num_rows: int, num_ids: int, seed: int) -> tuple[torch.Tensor, list[int]]:
    """A count table of ``num_rows`` random rows, column 0 summing to an odd ``c`` with ``c * E`` on a
    midpoint of the fp32 grid, column 1 to zero, column 2 to a count past 2^24; and its column sums."""
    table = torch.randint(0, 1000, (num_rows, num_ids), generator=generator(seed), dtype=torch.int32)
    table[:, 1] = 0
    big = 2**27 // num_ids + 1
    table[:, 0] = 0
    table[0, 0] = next(c for c in range(big, big + 64) if c % 2 and (c * num_ids) % 16 == 8)
    table[-1, 2] = 2**24 + 3
    return table, table.sum(0).tolist()


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_sum_kernel_over_several_chunks(target):
    """The sum alone, over a table of more DMA chunks than ``parts`` has versions."""
    num_ids = 72
    table, totals = crafted_table(3 * SUM_ROWS + 5, num_ids, 7)
    assert (totals[0] * num_ids) % 16 == 8
    for schedule in (REUSE_SCHEDULES if target == "ascend-sim" else (None,)):
        with sim_schedule(schedule):
            counts = torch.full((num_ids,), -7, dtype=torch.int32)
            build_count_sum.compiled(CountSumSpec(num_ids, COUNTS), target)(table, counts)
            assert counts.tolist() == totals, schedule
            for num_tokens, num_aux_topk in ((310690, 436), (5, 2**31 - 1), (2**29, 3)):
                fi = torch.full((num_ids,), float("nan"))
                build_count_sum.compiled(CountSumSpec(num_ids, FREQUENCIES), target)(table, fi, num_tokens,
                                                                                    num_aux_topk)
                assert_bitwise_equal(fi, defined_fi(totals, num_ids, num_tokens, num_aux_topk),
                                     f"{schedule} T={num_tokens} k={num_aux_topk}")


@pytest.mark.slow
def test_ascend_sim_several_id_tiles_per_core():
    """More id tiles than Ascend cores (a core sums several; its tiles reuse the buffers), E not a
    multiple of the tile, under both reuse schedules; and the ops end to end with two id tiles."""
    num_ids = 64 * 128 + 72
    table, totals = crafted_table(2 * SUM_ROWS + 3, num_ids, 8)
    for schedule in REUSE_SCHEDULES:
        with sim_schedule(schedule):
            counts = torch.zeros(num_ids, dtype=torch.int32)
            build_count_sum.compiled(CountSumSpec(num_ids, COUNTS), "ascend-sim")(table, counts)
            assert counts.tolist() == totals, schedule
            fi = torch.zeros(num_ids)
            build_count_sum.compiled(CountSumSpec(num_ids, FREQUENCIES), "ascend-sim")(table, fi, 310690, 436)
            assert_bitwise_equal(fi, defined_fi(totals, num_ids, 310690, 436), schedule)
    for num_tokens in (1, 3 * BLOCK_M + 5):
        idx = id_routing(num_tokens, 200, 8, num_tokens)
        check_both(idx, 200, 8, f"ascend-sim E=200 T={num_tokens}", target="ascend-sim")


@pytest.mark.slow
@pytest.mark.parametrize("num_topk", [1, 2, 16, 32])
def test_other_widths(num_topk):
    for num_tokens in (1, 2 * BLOCK_M + 1):
        idx = id_routing(num_tokens, 40, num_topk, num_topk, "repeats")
        check_both(idx, 40, num_topk, f"K={num_topk} T={num_tokens}", target="cpu")


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
@pytest.mark.parametrize("bad", [72, -2, 2**32 + 3])  # the last: low word in range, high word not 0
def test_kernel_flags_bad_ids(target, bad):
    idx = id_routing(BLOCK_M + 3, 72, 6, 3)
    idx[BLOCK_M + 1, 2] = bad
    with pytest.raises(ValueError, match=r"group_count: group_idx holds ids outside .*-1 marks an unused"):
        group_count(idx, 72, target=target)
    with pytest.raises(ValueError, match=r"aux_fi: topk_idx holds ids outside .*-1 marks an unused"):
        aux_fi(idx, 72, 6, target=target)
    with pytest.raises(ValueError, match="group_idx holds ids outside"):
        group_count(idx, 72, target="torch")
    with pytest.raises(ValueError, match="topk_idx holds ids outside"):
        aux_fi(idx, 72, 6, target="torch")


IDX = id_routing(4, 8, 2, 5)
HUGE = torch.zeros(2**25, 32, dtype=torch.int64, device="meta")


@pytest.mark.parametrize(("args", "error", "match"), [
    ((IDX.int(), 8), TypeError, "group_idx"),
    ((IDX.flatten(), 8), ValueError, "group_idx"),
    ((IDX.t(), 8), ValueError, "group_idx"),
    ((torch.zeros(4, 0, dtype=torch.int64), 8), ValueError, "group_idx must have 1 to 32 columns"),
    ((torch.zeros(4, 33, dtype=torch.int64), 40), ValueError, "group_idx must have 1 to 32 columns"),
    ((HUGE, 8), ValueError, "group_idx has too many entries"),
    ((IDX, 0), ValueError, "num_groups"),
    ((IDX, 65537), ValueError, "num_groups"),
    ((IDX, 8.0), TypeError, "num_groups"),
    ((IDX, True), TypeError, "num_groups"),
])
def test_group_count_bad_arguments_raise_before_any_kernel(monkeypatch, args, error, match):
    monkeypatch.setattr(kernels, "launch_group_count", pytest.fail)
    with pytest.raises(error, match=match):
        group_count(*args, target="cpu")


@pytest.mark.parametrize(("args", "error", "match"), [
    ((IDX.int(), 8, 2), TypeError, "topk_idx"),
    ((IDX.flatten(), 8, 2), ValueError, "topk_idx"),
    ((IDX.t(), 8, 2), ValueError, "topk_idx"),
    ((torch.zeros(4, 33, dtype=torch.int64), 40, 2), ValueError, "topk_idx must have 1 to 32 columns"),
    ((HUGE, 8, 2), ValueError, "topk_idx has too many entries"),
    ((IDX, 0, 2), ValueError, "num_experts"),
    ((IDX, 8.0, 2), TypeError, "num_experts"),
    ((IDX, 8, 0), ValueError, "num_aux_topk"),
    ((IDX, 8, 2**31), ValueError, "num_aux_topk"),
    ((IDX, 8, 2.0), TypeError, "num_aux_topk"),
    ((IDX, 8, None), TypeError, "num_aux_topk"),
])
def test_aux_fi_bad_arguments_raise_before_any_kernel(monkeypatch, args, error, match):
    monkeypatch.setattr(kernels, "launch_aux_fi", pytest.fail)
    with pytest.raises(error, match=match):
        aux_fi(*args, target="cpu")


def test_bad_target_or_flavor_and_parallel_refuses_torch(monkeypatch):
    monkeypatch.setattr(kernels, "launch_group_count", pytest.fail)
    monkeypatch.setattr(kernels, "launch_aux_fi", pytest.fail)
    with pytest.raises(ValueError, match="target"):
        group_count(IDX, 8, target="tpu")
    with pytest.raises(ValueError, match="flavor"):
        aux_fi(IDX, 8, 2, target="cpu", flavor="rocm")
    with pytest.raises(ValueError, match="torch"):
        group_count_parallel(IDX, 8, target="torch")
    with pytest.raises(ValueError, match="torch"):
        aux_fi_parallel(IDX, 8, 2, target="torch")


def test_fake_tensors_give_the_output_shapes():
    meta = torch.zeros(10, 4, dtype=torch.int64, device="meta")
    counts = group_count(meta, 9)
    fi = aux_fi(meta, 9, 4)
    assert (counts.shape, counts.dtype, counts.device.type) == ((9,), torch.int32, "meta")
    assert (fi.shape, fi.dtype, fi.device.type) == ((9,), torch.float32, "meta")


def test_lowering():
    for output, name, simt in ((COUNTS, "group_count_sum_kernel", 2), (FREQUENCIES, "aux_fi_sum_kernel", 3)):
        src = build_count_sum.source(CountSumSpec(256, output), "ascend")
        assert f"__global__ __vector__ void {name}" in src
        # Lanes per id: zero, add the chunk's rows (a per-lane loop of a runtime length), and for
        # aux_fi the quotients; the table in and the results out by DMA.
        assert_vector_regions(src, simd=0, simt=simt)
        assert barriers_in_thread_guards(src) == 0
        assert dma_counts(src) >= (1, 1), name
        if output == FREQUENCIES:
            # Exact 64-bit products, each converted once; the quotient checked by its residual.
            assert "(int64_t)" in src and "fmaf(" in src


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_lowering_compiles():
    # The frequencies' kernel: the counts' body (the same column sums) plus the quotients.
    check_cuda_source(build_count_sum.source(CountSumSpec(256, FREQUENCIES), "cuda"))
