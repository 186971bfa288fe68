"""The normalisation references against fp32 expression trees built here, one rounding per add."""

import pytest
import torch

from vmi_core.formats import f32_bits
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_moe.reference import denominator, normalize_weight

FLAVORS = ("ascend", "cuda")
EPS = torch.tensor(1e-20, dtype=torch.float32)


def f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def spread_weights(num_rows: int, k: int, seed: int) -> torch.Tensor:
    """Positive weights over several binades, so the summation order changes the rounding."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(num_rows, k, generator=g) * torch.exp2(torch.randint(-12, 12, (num_rows, k), generator=g).float())


def sequential_tree(row: list[torch.Tensor]) -> torch.Tensor:
    total = row[0]
    for value in row[1:]:
        total = total + value
    return total + EPS


def residue_tree(row: list[torch.Tensor], first: int = 0, stride: int = 1) -> torch.Tensor | None:
    """The sum of the lanes congruent to ``first`` modulo ``stride`` as lane 0 of a 32-lane xor butterfly
    combines them: the halves ``first`` and ``first + stride`` modulo ``2 * stride``; None if no lane exists."""
    if first >= len(row):
        return None
    if stride == 32:
        return row[first]
    low = residue_tree(row, first, 2 * stride)
    high = residue_tree(row, first + stride, 2 * stride)
    return low if high is None else low + high


def butterfly_tree(row: list[torch.Tensor]) -> torch.Tensor:
    return residue_tree(row) + EPS


def _rows(weights: torch.Tensor) -> list[list[torch.Tensor]]:
    return [[f32(v) for v in row] for row in weights.tolist()]


def test_k6_butterfly_order() -> None:
    weights = spread_weights(64, 6, seed=6)
    expected = []
    for w0, w1, w2, w3, w4, w5 in _rows(weights):
        expected.append(EPS + (((w0 + w4) + w2) + ((w1 + w5) + w3)))
    assert_bitwise_equal(denominator(weights, "cuda"), torch.stack(expected), "cuda denominator")
    sequential = torch.stack([sequential_tree(row) for row in _rows(weights)])
    assert_bitwise_equal(denominator(weights, "ascend"), sequential, "ascend denominator")
    # The data must tell the two orders apart, or the checks above prove nothing.
    assert not torch.equal(denominator(weights, "cuda"), sequential)


def test_worked_example_sum_order() -> None:
    w = [f32(x) for x in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)]
    sequential = ((((w[0] + w[1]) + w[2]) + w[3]) + w[4]) + w[5]
    butterfly = ((w[0] + w[4]) + w[2]) + ((w[1] + w[5]) + w[3])
    assert int(f32_bits(sequential)) == 0x40066666
    assert int(f32_bits(butterfly)) == 0x40066667
    weights = torch.stack(w)[None, :]
    assert int(f32_bits(denominator(weights, "ascend"))[0]) == 0x40066666
    assert int(f32_bits(denominator(weights, "cuda"))[0]) == 0x40066667


@pytest.mark.parametrize("k", range(1, 33))
def test_every_width(k: int) -> None:
    weights = spread_weights(4, k, seed=100 + k)
    rows = _rows(weights)
    assert_bitwise_equal(denominator(weights, "ascend"), torch.stack([sequential_tree(r) for r in rows]))
    assert_bitwise_equal(denominator(weights, "cuda"), torch.stack([butterfly_tree(r) for r in rows]))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_normalized_is_one_division(flavor: str) -> None:
    weights = spread_weights(32, 9, seed=9)
    denom, normalized = normalize_weight(weights, flavor)
    assert_bitwise_equal(denom, denominator(weights, flavor))
    expected = [[w / d for w in row] for row, d in zip(_rows(weights), denom.unbind(), strict=True)]
    assert_bitwise_equal(normalized, torch.stack([torch.stack(row) for row in expected]))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_all_zero_rows(flavor: str) -> None:
    weights = spread_weights(3, 8, seed=0)
    weights[1] = 0.0
    denom, normalized = normalize_weight(weights, flavor)
    assert int(f32_bits(denom[1])) == int(f32_bits(EPS))
    assert_bitwise_equal(normalized[1], torch.zeros(8))


@pytest.mark.parametrize("flavor", FLAVORS)
def test_no_tokens(flavor: str) -> None:
    denom, normalized = normalize_weight(torch.zeros(0, 6), flavor)
    assert tuple(denom.shape) == (0,) and denom.dtype == torch.float32
    assert tuple(normalized.shape) == (0, 6) and normalized.dtype == torch.float32


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="columns"):
        denominator(torch.zeros(2, 33), "cuda")
    with pytest.raises(ValueError, match="float32"):
        denominator(torch.zeros(2, 4, dtype=torch.float64), "cuda")
    with pytest.raises(ValueError, match="flavor"):
        denominator(torch.zeros(2, 4), "rocm")
