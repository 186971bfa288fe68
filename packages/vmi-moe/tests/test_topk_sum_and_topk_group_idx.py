"""topk_sum_and_topk_group_idx on the cpu target (both flavors) and on ascend-sim against the
reference, bit for bit, and against hand-worked rows.

Group indices are compared with ``assert_bitwise_equal`` (dtype, shape, strides, bits). Data:
normal scores, rows rounded to few values (ties between groups and within a group: equal maxima
both count in a top-2 sum), ``+-inf``, signed zeros (``-0.0`` ties ``+0.0``). Token counts cover
the empty batch, one token, both sides of a work tile and several tiles split over cpu threads.
Errors: each bad argument before any kernel runs; a NaN score or NaN group score after it.
"""

import pytest
import torch

from vmi_core.tools.source_checks import assert_vector_regions, barriers_in_thread_guards, dma_counts
from vmi_core.tools.testing import assert_bitwise_equal, generator
from vmi_devkit.cuda import check_cuda_source
from vmi_moe import topk_sum_and_topk_group_idx, topk_sum_and_topk_group_idx_parallel
from vmi_moe.kernels.topk_sum_and_topk_group_idx import TopkGroupSpec, build_topk_sum_and_topk_group_idx
from vmi_moe.reference import topk_sum_and_topk_group_idx as reference_groups

# (G, P, num_topk_sum, num_topk_groups): V3/V4's 8 groups of 32 keeping 4 by top-2 sums, and 4 groups
# of 18 (72 experts) by top-1.
CASES = [(8, 32, 2, 4), (4, 18, 1, 2)]
ROWS = [0, 1, 31, 33, 300]


def scores_for(num_tokens: int, num_groups: int, per_group: int, seed: int) -> torch.Tensor:
    g = generator(seed)
    x = torch.randn(num_tokens, num_groups, per_group, generator=g)
    x[1::3] = x[1::3].round()  # ties
    x[2::7] = 0.0
    x[2::7, :, 0] = -0.0
    if num_tokens > 5:
        x[5, 0, 0] = float("inf")
        x[4, :, :] = float("-inf")
    return x.contiguous()


@pytest.mark.parametrize(("G", "P", "S", "KG"), CASES)
@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_matches_reference(G, P, S, KG, flavor):
    for num_tokens in ROWS:
        x = scores_for(num_tokens, G, P, num_tokens)
        assert_bitwise_equal(topk_sum_and_topk_group_idx(x, S, KG, target="cpu", flavor=flavor),
                             reference_groups(x, S, KG), f"G={G} P={P} S={S} K={KG} T={num_tokens} {flavor}")


@pytest.mark.parametrize(("G", "P", "S", "KG"), CASES)
def test_ascend_sim(G, P, S, KG):
    for num_tokens in (1, 70):
        x = scores_for(num_tokens, G, P, num_tokens + 1)
        assert_bitwise_equal(topk_sum_and_topk_group_idx_parallel(x, S, KG, target="ascend-sim"),
                             reference_groups(x, S, KG), f"ascend-sim G={G} T={num_tokens}")


def test_hand_worked_rows():
    # In CASES' shapes (their kernels), every other score -100. Top-2 sums of 8 groups of 32:
    # [10 (5 + 5), 9 (6 + 3), 10 (4 + 6), -inf, -200, ...]: groups 0 and 2 tie (0 first), then 1, 4.
    x = torch.full((1, 8, 32), -100.0)
    x[0, 0, :2] = 5.0
    x[0, 1, 5], x[0, 1, 6] = 6.0, 3.0
    x[0, 2, 30], x[0, 2, 31] = 4.0, 6.0
    x[0, 3] = -float("inf")
    # Top-1 of 4 groups of 18: [5, 6, 6, -inf]: 1, then 2 (the tie's lower index).
    y = torch.full((1, 4, 18), -100.0)
    y[0, 0, 3], y[0, 1, 17], y[0, 2, 0], y[0, 3] = 5.0, 6.0, 6.0, -float("inf")
    for target in ("cpu", "ascend-sim"):
        assert topk_sum_and_topk_group_idx(x, 2, 4, target=target).tolist() == [[0, 2, 1, 4]]
        assert topk_sum_and_topk_group_idx(y, 1, 2, target=target).tolist() == [[1, 2]]


@pytest.mark.parametrize("target", ["cpu", "ascend-sim", "torch"])
@pytest.mark.parametrize("bad", ["nan", "inf - inf"])
def test_nan_group_scores_raise(target, bad):
    x = scores_for(40, 8, 32, 0)
    if bad == "nan":
        x[37, 2, 1] = float("nan")
    else:
        x[37, 2] = -float("inf")
        x[37, 2, 7] = float("inf")
    with pytest.raises(ValueError, match="NaN"):
        topk_sum_and_topk_group_idx(x, 2, 4, target=target)


def test_inf_is_a_score():
    # +inf's group scores +inf by top-1 (no NaN); -inf groups rank last, by index.
    x = torch.full((3, 4, 18), -float("inf"))
    x[0, 2, 5], x[1, 3, 0], x[2, 1, 1] = float("inf"), float("inf"), 1.0
    got = topk_sum_and_topk_group_idx(x, 1, 2, target="cpu")
    assert got.tolist() == [[2, 0], [3, 0], [1, 0]]
    assert_bitwise_equal(got, reference_groups(x, 1, 2), "infinities")


X = scores_for(4, 4, 3, 0)


@pytest.mark.parametrize(("args", "error", "match"), [
    ((X.double(), 2, 2), TypeError, "scores"),
    ((X.view(4, 12), 2, 2), ValueError, "scores"),
    ((X.transpose(1, 2), 2, 2), ValueError, "scores"),
    ((torch.zeros(4, 4, 0), 1, 2), ValueError, "groups of at least one expert"),
    ((torch.zeros(4, 257, 1), 1, 2), ValueError, "1 to 256 groups"),
    ((X, 3, 2), ValueError, "num_topk_sum"),
    ((X[:, :, :1].contiguous(), 2, 2), ValueError, "num_topk_sum"),
    ((X, 2, 0), ValueError, "num_topk_groups"),
    ((X, 2, 5), ValueError, "num_topk_groups"),
    ((X, 2.0, 2), TypeError, "num_topk_sum"),
])
def test_bad_arguments_raise_before_any_kernel(args, error, match):
    with pytest.raises(error, match=match):
        topk_sum_and_topk_group_idx(*args, target="cpu")


def test_lowering():
    src = build_topk_sum_and_topk_group_idx.source(TopkGroupSpec(8, 32, 2, 4), "ascend")
    assert "__global__ __vector__ void topk_sum_and_topk_group_idx_kernel" in src
    # The passes in vector code, one token per lane; the status word in SIMT.
    assert_vector_regions(src, simd=1, simt=1)
    assert barriers_in_thread_guards(src) == 0
    assert dma_counts(src) >= (1, 1)


@pytest.mark.cuda_compile
@pytest.mark.slow
def test_cuda_lowering_compiles():
    check_cuda_source(build_topk_sum_and_topk_group_idx.source(TopkGroupSpec(8, 32, 2, 4), "cuda"))
