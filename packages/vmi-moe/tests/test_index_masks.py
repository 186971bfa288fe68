"""mask_indices_by_tp and inplace_unique_group_indices on the cpu target (both flavors) and on
ascend-sim (the ascend flavor, its only one) against their references, bit for bit, and against
their definitions directly.

Every result is an integer tensor compared with ``assert_bitwise_equal`` (dtype, shape, strides,
bits). Independently of the references: a kept id maps back to the global id it came from
(``v = ((out // per_gpu) * num_tp_ranks + tp_rank) * per_gpu + out % per_gpu``) and every dropped
id is negative or another rank's; a deduplicated row keeps each group's first occurrence in place
and nothing else. Token counts cover the empty batch, one token, both sides of a work tile, several
tiles split over cpu threads and, on ascend-sim, more tiles than two per simulated core (the pipe
schedule cycling over ``SIM_SCHEDULES``). Ids cover the int64 and int32 extremes, ids of ``n`` and
above, and rank counts up to ``2^31 - 1``. Errors: each bad argument before any kernel runs, and
what only the kernel sees (an int64 id above ``2^31 - 1``; a group id outside ``[-1, num_groups)``)
after it, with ``group_indices`` left unchanged.

Kernels in the default run: mask (K = 8, int64) on cpu and ascend-sim, mask (K = 3, int32) on cpu,
unique (K = 6) on cpu and ascend-sim; every K in the slow run.
"""

import pytest
import torch

from vmi_core.cpu_parallel import THREADS_ENV
from vmi_core.plan import Plan
from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_core.tools.testing import SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.moe_cases import FLAVORS, SIM, counts_on, flavor_targets
from vmi_devkit.cuda import check_cuda_source
from vmi_devkit.errors import no_kernel_fixture
from vmi_moe.kernels.inplace_unique_group_indices import UniqueGroupSpec, build_inplace_unique_group_indices
from vmi_moe.kernels.mask_indices_by_tp import MaskIndicesSpec, build_mask_indices_by_tp
from vmi_moe.ops.inplace_unique_group_indices import (
    inplace_unique_group_indices,
    inplace_unique_group_indices_parallel,
)
from vmi_moe.ops.mask_indices_by_tp import MASK_INDICES_BY_TP, mask_indices_by_tp, mask_indices_by_tp_parallel
from vmi_moe.reference.indices import mask_indices_by_tp as reference_mask
from vmi_moe.reference.indices import unique_group_indices as reference_unique

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MASK_BLOCK_M = MaskIndicesSpec(8, True).block_m
UNIQUE_BLOCK_M = UniqueGroupSpec(6).block_m
COUNTS = [0, 1, 33, 129, 300]

# (n, num_ep_ranks, tp_rank, num_tp_ranks): V4-like, tp = 1, n not a multiple of the EP ranks, one
# expert per rank, and huge blocks and rank counts.
RANKS = [(256, 8, 1, 2), (256, 8, 0, 1), (72, 5, 2, 3), (16, 16, 3, 4), (INT32_MAX, 3, 1, 2),
         (1000, 1, 1, INT32_MAX)]


def expert_ids(num_tokens: int, num_topk: int, n: int, seed: int, dtype=torch.int64) -> torch.Tensor:
    """Ids in ``[-3, n + n // 2]`` (at most ``2^31 - 1``: some past ``n``, a few negative), some at the
    extremes of ``dtype``'s accepted range (``2^31 - 1``, the most negative value)."""
    g = generator(seed)
    ids = torch.randint(-3, min(n + n // 2, INT32_MAX) + 1, (num_tokens, num_topk), generator=g, dtype=torch.int64)
    if ids.numel():
        flat = ids.view(-1)
        picks = torch.randint(flat.numel(), (max(1, flat.numel() // 50),), generator=g)
        low = INT64_MIN if dtype == torch.int64 else -(2**31)
        flat[picks] = torch.tensor([INT32_MAX, low, -1, 0, n - 1, n])[torch.arange(len(picks)) % 6]
    return ids.to(dtype).contiguous()


def check_mask_definition(ids: torch.Tensor, masked: torch.Tensor, n, num_ep_ranks, tp_rank, num_tp_ranks) -> None:
    """A kept id maps back to its global id; a dropped one is negative or another rank's."""
    per_gpu = n // num_ep_ranks
    v, out = ids.to(torch.int64), masked.to(torch.int64)
    kept = out >= 0
    assert bool((out[~kept] == -1).all())
    local = out[kept]
    back = ((local // per_gpu) * num_tp_ranks + tp_rank) * per_gpu + local % per_gpu
    assert torch.equal(back, v[kept]), "a kept id does not map back to its global id"
    dropped = v[~kept]
    assert bool(((dropped < 0) | ((dropped.clamp_min(0) // per_gpu) % num_tp_ranks != tp_rank)).all())


def check_mask(ids, ranks, what, target="cpu", flavor=None) -> None:
    masked = mask_indices_by_tp(ids, *ranks, target=target, flavor=flavor)
    assert_bitwise_equal(masked, reference_mask(ids, *ranks), what)
    check_mask_definition(ids, masked, *ranks)


# --- mask_indices_by_tp ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("flavor", "target"), flavor_targets())
def test_mask_matches_reference(flavor, target):
    for seed, T in enumerate(counts_on(target, COUNTS, MASK_BLOCK_M)):
        ranks = RANKS[seed % len(RANKS)]
        ids = expert_ids(T, 8, ranks[0], seed)
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):  # ascend-sim launches only
            check_mask(ids, ranks, f"T={T} ranks={ranks}", target, flavor)


@pytest.mark.parametrize("ranks", RANKS, ids=str)
def test_mask_every_rank(ranks):
    """Every TP rank of a configuration (the last two rank counts: the first ranks and the last);
    together the ranks keep each non-negative id exactly once."""
    n, num_ep_ranks, _, num_tp_ranks = ranks
    ids = expert_ids(200, 3, n, 7, torch.int32)
    kept = torch.zeros(ids.shape, dtype=torch.int64)
    tp_ranks = range(num_tp_ranks) if num_tp_ranks <= 4 else [0, 1, 2, num_tp_ranks - 1]
    for tp_rank in tp_ranks:
        masked = mask_indices_by_tp(ids, n, num_ep_ranks, tp_rank, num_tp_ranks, target="cpu")
        assert_bitwise_equal(masked, reference_mask(ids, n, num_ep_ranks, tp_rank, num_tp_ranks), f"rank {tp_rank}")
        check_mask_definition(ids, masked, n, num_ep_ranks, tp_rank, num_tp_ranks)
        kept += masked >= 0
    if num_tp_ranks <= 4:
        assert torch.equal(kept, (ids >= 0).long())


def test_mask_worked_example():
    """n = 16 experts on 4 EP ranks (blocks of 4 ids), 2 TP ranks: TP rank 1 keeps the odd blocks; block 1
    becomes local experts 0..3, block 3 (the next DP group) 4..7, and blocks 5 and 7 (ids of n and above)
    8..11 and 12..15. The op is element-wise: the int32 kernel (K = 3) takes the same ids in rows of 3."""
    ids = torch.tensor([[0, 4, 5, 7, 8, 12, 15, -1], [16, 20, 3, 13, -5, 9, 6, 14], [23, 24, 27, 28, 11, 1, 2, -2]])
    expected = torch.tensor([[-1, 0, 1, 3, -1, 4, 7, -1], [-1, 8, -1, 5, -1, -1, 2, 6],
                             [11, -1, -1, 12, -1, -1, -1, -1]])
    for target in ("cpu", "torch"):
        assert_bitwise_equal(mask_indices_by_tp(ids, 16, 4, 1, 2, target=target), expected, f"int64 {target}")
        assert_bitwise_equal(mask_indices_by_tp(ids.int().view(8, 3), 16, 4, 1, 2, target=target),
                             expected.int().view(8, 3), f"int32 {target}")


def test_mask_extremes():
    """int64 ids from -2^63 to 2^31 - 1 and int32 ids over their whole range, with blocks of one and of
    2^31 - 1 experts (the default run's kernels: int64 rows of 8, int32 rows of 3)."""
    wide = torch.tensor([INT64_MIN, -(2**32), -(2**31) - 1, -(2**31), -2, -1, 0, 1, 2, 3, 5, 6, 7,
                         INT32_MAX - 2, INT32_MAX - 1, INT32_MAX]).view(2, 8)
    narrow = torch.tensor([-(2**31), -(2**31) + 1, -2, -1, 0, 1, 2, 3, 4, INT32_MAX - 1, INT32_MAX, 7],
                          dtype=torch.int32).view(4, 3)
    for ranks in [(INT32_MAX, 1, 0, 1), (INT32_MAX, INT32_MAX, 0, 2), (INT32_MAX, INT32_MAX, 1, 2),
                  (INT32_MAX, 2, 0, INT32_MAX), (INT32_MAX, 2, 1, 2), (5, 2, 1, 3), (7, 1, 0, 3)]:
        for ids in (wide, narrow):
            check_mask(ids, ranks, f"{ids.dtype} ranks={ranks}")


def test_mask_int32_kernel():
    for T in COUNTS:
        ids = expert_ids(T, 3, 256, T, torch.int32)
        for flavor in FLAVORS:
            check_mask(ids, RANKS[0], f"T={T} {flavor}", flavor=flavor)


@pytest.mark.parametrize("target", ["cpu", SIM, "torch"])
@pytest.mark.parametrize("bad", [2**31, 2**32 + 3, INT64_MAX])
def test_mask_flags_ids_above_int32(target, bad):
    ids = expert_ids(MASK_BLOCK_M + 3, 8, 256, 3)
    ids[MASK_BLOCK_M + 1, 2] = bad
    with pytest.raises(ValueError, match=r"indices holds ids above 2\^31 - 1"):
        mask_indices_by_tp(ids, 256, 8, 1, 2, target=target)


def test_mask_planned_call_checks_the_ids_again():
    """A repeat cpu call runs from its signature's launch plan, which repeats the status check."""
    ids = expert_ids(40, 8, 256, 6)
    for _ in range(2):
        assert_bitwise_equal(mask_indices_by_tp(ids, 256, 8, 1, 2, target="cpu"), reference_mask(ids, 256, 8, 1, 2))
    assert isinstance(MASK_INDICES_BY_TP.plan_of(ids, 256, 8, 1, 2, target="cpu"), Plan), "no launch plan"
    ids[3, 3] = 2**40
    with pytest.raises(ValueError, match=r"indices holds ids above 2\^31 - 1"):
        mask_indices_by_tp(ids, 256, 8, 1, 2, target="cpu")


def test_mask_rows_do_not_depend_on_cpu_threads(vmi_env):
    ids = expert_ids(20 * MASK_BLOCK_M + 9, 8, 256, 4)
    results = {}
    for threads in ("1", "3"):
        vmi_env.setenv(THREADS_ENV, threads)
        results[threads] = mask_indices_by_tp(ids, 256, 8, 1, 2, target="cpu")
    assert_bitwise_equal(results["3"], results["1"], "3 threads")
    assert_bitwise_equal(results["1"], reference_mask(ids, 256, 8, 1, 2), "reference")


def test_mask_entry_points_agree():
    ids = expert_ids(100, 8, 256, 5)
    kept = ids.clone()
    masked = mask_indices_by_tp(ids, 256, 8, 1, 2, target="cpu")
    for what, other in {"second run": mask_indices_by_tp(ids, 256, 8, 1, 2, target="cpu"),
                        "cuda flavor": mask_indices_by_tp(ids, 256, 8, 1, 2, target="cpu", flavor="cuda"),
                        "parallel": mask_indices_by_tp_parallel(ids, 256, 8, 1, 2, target="cpu"),
                        "torch": mask_indices_by_tp(ids, 256, 8, 1, 2, target="torch"),
                        "dispatcher": torch.ops.vmi.mask_indices_by_tp(ids, 256, 8, 1, 2, target="cpu")}.items():
        assert_bitwise_equal(other, masked, what)
    assert_bitwise_equal(ids, kept, "input unchanged")
    meta = mask_indices_by_tp(torch.empty(5, 8, dtype=torch.int32, device="meta"), 256, 8, 1, 2)
    assert meta.shape == (5, 8) and meta.dtype == torch.int32 and meta.device.type == "meta"


# --- inplace_unique_group_indices -------------------------------------------------------------------------------

def group_ids(num_tokens: int, num_topk: int, num_groups: int, seed: int, kind: str = "random") -> torch.Tensor:
    g = generator(seed)
    if kind == "random":  # repeats within a row, ~10% unused
        ids = torch.randint(0, num_groups, (num_tokens, num_topk), generator=g)
        ids[torch.rand(ids.shape, generator=g) < 0.1] = -1
    elif kind == "one group":
        ids = torch.full((num_tokens, num_topk), num_groups - 1)
    elif kind == "unused":
        ids = torch.full((num_tokens, num_topk), -1)
    else:  # "distinct": a permutation of the groups per row, no repeats
        ids = torch.rand(num_tokens, num_groups, generator=g).argsort(dim=1)[:, :num_topk]
    return ids.contiguous()


def check_unique_definition(before: torch.Tensor, after: torch.Tensor) -> None:
    """Each group's first occurrence in a row stays in place; every other entry is -1."""
    for row_before, row_after in zip(before.tolist(), after.tolist(), strict=True):
        seen = set()
        for v, w in zip(row_before, row_after, strict=True):
            assert w == (v if v >= 0 and v not in seen else -1), (row_before, row_after)
            seen.add(v)


def check_unique(ids: torch.Tensor, num_groups: int, what: str, target: str = "cpu", flavor=None) -> torch.Tensor:
    expected = reference_unique(ids, num_groups)
    result = ids.clone()
    version = result._version
    inplace_unique_group_indices(result, num_groups, target=target, flavor=flavor)
    assert_bitwise_equal(result, expected, what)
    if ids.numel():
        assert result._version > version, "the version counter of group_indices was not bumped"
    return result


@pytest.mark.parametrize(("flavor", "target"), flavor_targets())
def test_unique_matches_reference(flavor, target):
    for seed, T in enumerate(counts_on(target, COUNTS, UNIQUE_BLOCK_M)):
        num_groups = (4, 16, 128, INT32_MAX)[seed % 4]
        ids = group_ids(T, 6, min(num_groups, 1000), seed)
        if num_groups == INT32_MAX:
            ids = torch.where(ids >= 0, INT32_MAX - 1 - ids, ids)  # ids near the top of the range
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):  # ascend-sim launches only
            result = check_unique(ids, num_groups, f"T={T} G={num_groups}", target, flavor)
        if T <= 300:
            check_unique_definition(ids, result)


@pytest.mark.parametrize("kind", ["one group", "unused", "distinct"])
def test_unique_degenerate_rows(kind):
    ids = group_ids(2 * UNIQUE_BLOCK_M + 3, 6, 8, 1, kind)
    for flavor in FLAVORS:
        result = check_unique(ids, 8, f"{kind} {flavor}", flavor=flavor)
        check_unique_definition(ids, result)
    if kind == "distinct":
        assert torch.equal(result, ids)


def test_unique_worked_example():
    ids = torch.tensor([[3, 1, 3, -1, 1, 0], [5, 5, 5, 5, 5, 5], [-1, -1, 2, -1, 2, 7]])
    expected = torch.tensor([[3, 1, -1, -1, -1, 0], [5, -1, -1, -1, -1, -1], [-1, -1, 2, -1, -1, 7]])
    for target in ("cpu", "torch"):
        result = ids.clone()
        assert inplace_unique_group_indices(result, 8, target=target) is None
        assert_bitwise_equal(result, expected, target)


@pytest.mark.parametrize("target", ["cpu", SIM, "torch"])
@pytest.mark.parametrize("bad", [-2, 16, 2**32 + 3, -(2**32) - 1, INT64_MIN])
def test_unique_bad_ids_raise_and_leave_the_input_unchanged(target, bad):
    """A bad id in the second work tile: the first tile's results must not reach ``group_indices``."""
    ids = group_ids(UNIQUE_BLOCK_M + 3, 6, 16, 3)
    ids[UNIQUE_BLOCK_M + 1, 2] = bad
    before = ids.clone()
    with pytest.raises(ValueError, match=r"group_indices holds group ids outside \[-1, 16\)"):
        inplace_unique_group_indices(ids, 16, target=target)
    assert_bitwise_equal(ids, before, "group_indices after the error")


def test_unique_rows_do_not_depend_on_cpu_threads(vmi_env):
    ids = group_ids(20 * UNIQUE_BLOCK_M + 9, 6, 8, 4)
    results = {}
    for threads in ("1", "3"):
        vmi_env.setenv(THREADS_ENV, threads)
        results[threads] = check_unique(ids, 8, f"{threads} threads")
    assert_bitwise_equal(results["3"], results["1"], "3 threads")


def test_unique_entry_points_agree():
    ids = group_ids(100, 6, 8, 5)
    expected = reference_unique(ids, 8)
    for what, run in {"parallel": lambda x: inplace_unique_group_indices_parallel(x, 8, target="cpu"),
                      "cuda flavor": lambda x: inplace_unique_group_indices(x, 8, target="cpu", flavor="cuda"),
                      "dispatcher": lambda x: torch.ops.vmi.inplace_unique_group_indices(x, 8, target="cpu")}.items():
        result = ids.clone()
        assert run(result) is None
        assert_bitwise_equal(result, expected, what)
    view = ids.clone()[10:20]  # a contiguous view: written where it is
    inplace_unique_group_indices(view, 8, target="cpu")
    assert_bitwise_equal(view, expected[10:20], "view")
    inplace_unique_group_indices(torch.empty(3, 6, dtype=torch.int64, device="meta"), 8)


# --- errors before any kernel --------------------------------------------------------------------------------------

no_kernel = no_kernel_fixture("vmi_moe.kernels.mask_indices_by_tp", "vmi_moe.kernels.inplace_unique_group_indices",
                              autouse=False)
IDS = torch.zeros(4, 8, dtype=torch.int64)
GROUPS = torch.zeros(4, 6, dtype=torch.int64)


@pytest.mark.usefixtures("no_kernel")
@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: mask_indices_by_tp(IDS.tolist(), 256, 8, 1, 2), TypeError, "indices must be a torch.Tensor"),
    (lambda: mask_indices_by_tp(IDS.float(), 256, 8, 1, 2), TypeError, "indices must be torch.int64 or torch.int32"),
    (lambda: mask_indices_by_tp(IDS.short(), 256, 8, 1, 2), TypeError, "indices must be torch.int64 or torch.int32"),
    (lambda: mask_indices_by_tp(IDS[0], 256, 8, 1, 2), ValueError, "indices must have shape"),
    (lambda: mask_indices_by_tp(IDS.view(2, 2, 8), 256, 8, 1, 2), ValueError, "indices must have shape"),
    (lambda: mask_indices_by_tp(IDS.t(), 256, 8, 1, 2), ValueError, "indices must be contiguous"),
    (lambda: mask_indices_by_tp(IDS[:, ::2], 256, 8, 1, 2), ValueError, "indices must be contiguous"),
    (lambda: mask_indices_by_tp(torch.zeros(4, 0, dtype=torch.int64), 256, 8, 1, 2), ValueError, "1 to 32 columns"),
    (lambda: mask_indices_by_tp(torch.zeros(4, 33, dtype=torch.int64), 256, 8, 1, 2), ValueError, "1 to 32 columns"),
    (lambda: mask_indices_by_tp(IDS, 0, 1, 0, 1), ValueError, "n must be in"),
    (lambda: mask_indices_by_tp(IDS, 2**31, 8, 1, 2), ValueError, "n must be in"),
    (lambda: mask_indices_by_tp(IDS, 256.0, 8, 1, 2), TypeError, "n must be an int"),
    (lambda: mask_indices_by_tp(IDS, 256, 0, 1, 2), ValueError, "num_ep_ranks must be >= 1"),
    (lambda: mask_indices_by_tp(IDS, 4, 8, 1, 2), ValueError, r"num_ep_ranks \(8\) must not exceed n \(4\)"),
    (lambda: mask_indices_by_tp(IDS, 256, True, 1, 2), TypeError, "num_ep_ranks must be an int"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, 1, 0), ValueError, "num_tp_ranks must be in"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, 0, 2**31), ValueError, "num_tp_ranks must be in"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, 2, 2), ValueError, r"tp_rank \(2\) must be below num_tp_ranks \(2\)"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, -1, 2), ValueError, "tp_rank must be >= 0"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, "1", 2), TypeError, "tp_rank must be an int"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, 1, 2, target="ascend"), ValueError, "target 'ascend'"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, 1, 2, target="tpu"), ValueError, "target must be one of"),
    (lambda: mask_indices_by_tp(IDS, 256, 8, 1, 2, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: mask_indices_by_tp_parallel(IDS, 256, 8, 1, 2, target="torch"), ValueError, "always runs the kernel"),
    (lambda: inplace_unique_group_indices(GROUPS.numpy(), 8), TypeError, "group_indices must be a torch.Tensor"),
    (lambda: inplace_unique_group_indices(GROUPS.int(), 8), TypeError, "group_indices must be torch.int64"),
    (lambda: inplace_unique_group_indices(GROUPS[0], 8), ValueError, "group_indices must have shape"),
    (lambda: inplace_unique_group_indices(GROUPS.t(), 8), ValueError, "group_indices must be contiguous"),
    (lambda: inplace_unique_group_indices(GROUPS[:, :1].expand(4, 6), 8), ValueError,
     "group_indices must be contiguous"),
    (lambda: inplace_unique_group_indices(torch.zeros(4, 0, dtype=torch.int64), 8), ValueError, "1 to 32 columns"),
    (lambda: inplace_unique_group_indices(torch.zeros(4, 33, dtype=torch.int64), 8), ValueError, "1 to 32 columns"),
    (lambda: inplace_unique_group_indices(GROUPS, 0), ValueError, "num_groups must be in"),
    (lambda: inplace_unique_group_indices(GROUPS, 2**31), ValueError, "num_groups must be in"),
    (lambda: inplace_unique_group_indices(GROUPS, 8.0), TypeError, "num_groups must be an int"),
    (lambda: inplace_unique_group_indices(GROUPS, 8, target="cuda"), ValueError, "target 'cuda'"),
    (lambda: inplace_unique_group_indices(GROUPS, 8, flavor="rocm"), ValueError, "flavor must be one of"),
    (lambda: inplace_unique_group_indices_parallel(GROUPS, 8, target="torch"), ValueError, "always runs the kernel"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments_raise_before_any_kernel(call, error, match):
    before = GROUPS.clone()
    with pytest.raises(error, match=match):
        call()
    assert torch.equal(GROUPS, before)


# --- lowering -------------------------------------------------------------------------------------------------------

def test_lowering():
    src = build_mask_indices_by_tp.source(MaskIndicesSpec(8, True), "ascend")
    assert "__global__ __vector__ void mask_indices_by_tp_kernel" in src
    # Two integer divisions per id by runtime divisors: a SIMT region (the vector unit divides floats only).
    assert_vector_regions(src, simd=0, simt=1)
    assert barriers_in_thread_guards(src) == 0
    assert dma_counts(src) >= (1, 1)
    src = build_inplace_unique_group_indices.source(UniqueGroupSpec(6), "ascend")
    assert "__global__ __vector__ void inplace_unique_group_indices_kernel" in src
    # The compares in one SIMD region (gathers and scatters of columns); the status word in SIMT.
    assert_vector_regions(src, simd=1, simt=1)
    assert "vgather2" in src and "vscatter" in src
    assert barriers_in_thread_guards(src) == 0
    assert dma_counts(src) >= (1, 1)


@pytest.mark.slow
@pytest.mark.cuda_compile
def test_cuda_lowering_compiles():
    check_cuda_source(build_mask_indices_by_tp.source(MaskIndicesSpec(8, True), "cuda"))
    check_cuda_source(build_inplace_unique_group_indices.source(UniqueGroupSpec(6), "cuda"))


# --- slow: every K ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("K", range(1, 33))
def test_mask_every_topk(K):
    for dtype in (torch.int64, torch.int32):
        for seed, T in enumerate([1, 257, 4001]):
            ranks = RANKS[(K + seed) % len(RANKS)]
            check_mask(expert_ids(T, K, ranks[0], 300 + seed, dtype), ranks, f"K={K} T={T} {dtype}")


@pytest.mark.slow
@pytest.mark.parametrize("K", range(1, 33))
def test_unique_every_topk(K):
    for seed, T in enumerate([1, 257, 4001]):
        for num_groups in (1, 8, 128, 1000):
            check_unique(group_ids(T, K, num_groups, 400 + seed), num_groups, f"K={K} T={T} G={num_groups}")


@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 2, 9, 32])
def test_ascend_sim_every_kind_of_row(K):
    for dtype in (torch.int64, torch.int32):
        check_mask(expert_ids(300, K, 256, K, dtype), RANKS[K % len(RANKS)], f"K={K} {dtype}", SIM)
    check_unique(group_ids(300, K, 8, K), 8, f"K={K}", SIM)
