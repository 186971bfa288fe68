"""The top-k references: rank order with ties to the lower index, fresh strides, finite inputs only."""

import pytest
import torch

from vmi_core.tools.testing import assert_bitwise_equal
from vmi_moe.reference import stable_topk, topk_gate


def _idx(rows: list[list[int]], k: int) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, k)


@pytest.mark.parametrize(("k", "expected"), [(4, [1, 2, 4, 5]), (5, [1, 2, 4, 5, 0]), (6, [1, 2, 4, 5, 0, 3])])
def test_worked_example_ties(k: int, expected: list[int]) -> None:
    scores = torch.tensor([[2.0, 7.5, 7.5, -1.0, 7.5, 7.5]])
    assert_bitwise_equal(topk_gate(scores, k), _idx([expected], k))
    assert_bitwise_equal(stable_topk(scores, k), _idx([expected], k))


@pytest.mark.parametrize("value", [0.0, -3.25, 1e30])
def test_all_equal_rows_give_first_indices(value: float) -> None:
    scores = torch.full((3, 40), value)
    assert_bitwise_equal(topk_gate(scores, 8), torch.arange(8).expand(3, 8).contiguous())


def test_signed_zeros_tie() -> None:
    scores = torch.tensor([[-1.0, -0.0, 0.0, -0.0]])
    assert_bitwise_equal(topk_gate(scores, 3), _idx([[1, 2, 3]], 3))


@pytest.mark.parametrize("pair", [(63, 64), (127, 128)])
def test_ties_across_vector_boundaries(pair: tuple[int, int]) -> None:
    low, high = pair
    scores = torch.linspace(-1.0, 1.0, 200).flip(0).repeat(2, 1)
    scores[:, [low, high]] = 5.0
    scores[1, 0] = 5.0
    assert_bitwise_equal(topk_gate(scores, 3), _idx([[low, high, 0], [0, low, high]], 3))


def test_random_rows_match_a_python_ranking() -> None:
    scores = torch.randint(-4, 5, (16, 72), generator=torch.Generator().manual_seed(3)).float()
    k = 6
    expected = [sorted(range(72), key=lambda e, row=row: (-row[e], e))[:k] for row in scores.tolist()]
    assert_bitwise_equal(topk_gate(scores, k), _idx(expected, k))


@pytest.mark.parametrize(("num_tokens", "k"), [(0, 6), (0, 1), (5, 1), (5, 6), (1, 32)])
def test_strides_are_k_and_1(num_tokens: int, k: int) -> None:
    scores = torch.randn(num_tokens, 40, generator=torch.Generator().manual_seed(1))
    for out in (topk_gate(scores, k), stable_topk(scores, k)):
        assert out.dtype == torch.int64
        assert tuple(out.shape) == (num_tokens, k)
        assert out.stride() == (k, 1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_are_rejected(bad: float) -> None:
    scores = torch.zeros(4, 16)
    scores[2, 9] = bad
    with pytest.raises(ValueError, match="finite"):
        topk_gate(scores, 4)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="2-D"):
        topk_gate(torch.zeros(16), 4)
    with pytest.raises(ValueError, match="num_topk"):
        topk_gate(torch.zeros(2, 4), 5)
    with pytest.raises(ValueError, match="num_topk"):
        topk_gate(torch.zeros(2, 4), 0)
