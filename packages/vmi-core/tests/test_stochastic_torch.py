"""vmi_core.stochastic: the SR hash (§1.10) and the portable stochastic rounding rule."""

from __future__ import annotations

import math

import pytest
import torch

from vmi_core.formats import bf16_decode, bf16_encode, e2m1_decode, e4m3_decode, f32_bits
from vmi_core.stochastic import random16, sr_hash, stochastic_round

M32 = 0xFFFFFFFF


def py_hash(v: list[int], e: int) -> tuple[int, int]:
    """§1.10 hash with Python integers."""
    h = (v[0] * 0x5671D42B + v[1] * 0x9995E499 + v[2] * 0xACE1B8A5 + v[3] * 0xE153538D + e) & M32
    h ^= h >> 23
    h = (h * 0x7FEB352D) & M32
    h ^= h >> 16
    r0 = (h * 0x846CA68B) & M32
    r0 ^= r0 >> 11
    r1 = (h * 0xD35A2D97) & M32
    r1 ^= r1 >> 11
    return r0, r1


def random_bits(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << 32, shape, generator=g, dtype=torch.int64)


def sorted_grid(fmt: str) -> torch.Tensor:
    """Every finite value of ``fmt`` (float64, sorted, ±0 merged)."""
    if fmt == "bf16":
        values = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(torch.bfloat16).double()
    elif fmt == "e4m3":
        values = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(torch.float8_e4m3fn).double()
    else:
        mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
        values = torch.cat([mags, -mags])
    return torch.unique(values[torch.isfinite(values)])


def neighbours(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest grid value <= x and smallest grid value >= x."""
    grid = sorted_grid(fmt)
    xd = x.double()
    hi_idx = torch.searchsorted(grid, xd, side="left")
    lo_idx = torch.searchsorted(grid, xd, side="right") - 1
    return grid[lo_idx], grid[hi_idx]


class TestHash:
    def test_matches_python_integers(self):
        v = random_bits((200, 4), 0)
        e = random_bits((200,), 1)
        r0, r1 = sr_hash(v[:, 0], v[:, 1], v[:, 2], v[:, 3], e)
        expected = [py_hash(row, c) for row, c in zip(v.tolist(), e.tolist(), strict=True)]
        assert r0.tolist() == [a for a, _ in expected]
        assert r1.tolist() == [b for _, b in expected]

    def test_deterministic(self):
        v = random_bits((4, 50), 2)
        e = torch.arange(50)
        first = sr_hash(*v, e)
        second = sr_hash(*v.clone(), e.clone())
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))

    def test_random16_assignment(self):
        g = torch.Generator().manual_seed(3)
        values = torch.randn(3, 16, generator=g)
        counters = torch.arange(12).reshape(3, 4) * 7
        r16 = random16(values, counters)
        assert r16.shape == values.shape and r16.dtype == torch.int64
        bits = f32_bits(values).tolist()
        for row in range(3):
            for q in range(4):
                r0, r1 = py_hash(bits[row][4 * q:4 * q + 4], int(counters[row, q]))
                expected = [r0 & 0xFFFF, r0 >> 16, r1 & 0xFFFF, r1 >> 16]
                assert r16[row, 4 * q:4 * q + 4].tolist() == expected

    def test_random16_bad_shapes(self):
        with pytest.raises(ValueError):
            random16(torch.zeros(6), torch.zeros(1, dtype=torch.int64))
        with pytest.raises(ValueError):
            random16(torch.zeros(8), torch.zeros(3, dtype=torch.int64))


def uniform_r16(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << 16, (n,), generator=g, dtype=torch.int64)


def sample_values(fmt: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = {"bf16": 1e3, "e4m3": 100.0, "e2m1": 2.0}[fmt]
    lo_exp = {"bf16": -130, "e4m3": -14, "e2m1": -4}[fmt]
    x = torch.randn(n, generator=g) * scale
    tiny = torch.randn(n // 4, generator=g) * 2.0 ** torch.randint(lo_exp, 0, (n // 4,), generator=g)
    return torch.cat([x, tiny])


class TestStochasticRound:
    def test_worked_example_bf16(self):
        x = torch.tensor([0x3F80C000, 0x3F80C000], dtype=torch.int64).to(torch.int32).view(torch.float32)
        out = stochastic_round(x, "bf16", torch.tensor([0x1234, 0xD000]))
        assert (f32_bits(out) >> 16).tolist() == [0x3F81, 0x3F80]
        assert ((f32_bits(out) & 0xFFFF) == 0).all()

    @pytest.mark.parametrize("fmt", ["bf16", "e4m3", "e2m1"])
    def test_result_is_a_neighbour(self, fmt):
        x = sample_values(fmt, 20000, 10)
        q = {"bf16": math.inf, "e4m3": 448.0, "e2m1": 6.0}[fmt]
        out = stochastic_round(x, fmt, uniform_r16(x.numel(), 11)).double()
        lo, hi = neighbours(x.clamp(-q, q), fmt)
        assert ((out == lo) | (out == hi)).all()
        # At least some values rounded each way.
        inexact = lo != hi
        assert (out[inexact] == lo[inexact]).any() and (out[inexact] == hi[inexact]).any()

    @pytest.mark.parametrize("fmt", ["bf16", "e4m3", "e2m1"])
    def test_grid_values_unchanged(self, fmt):
        grid = sorted_grid(fmt).float()
        for seed in range(4):
            out = stochastic_round(grid, fmt, uniform_r16(grid.numel(), seed))
            assert torch.equal(out, grid)

    @pytest.mark.parametrize("fmt", ["bf16", "e4m3", "e2m1"])
    def test_sign_of_zero_kept(self, fmt):
        x = torch.tensor([-0.0, -1.4e-45, 0.0])
        out = stochastic_round(x, fmt, torch.full((3,), 0xFFFF))
        assert (f32_bits(out) >> 31).tolist() == [1, 1, 0]
        assert (out == 0).all()

    def test_saturation_and_specials(self):
        x = torch.tensor([math.inf, -math.inf, 500.0, -448.0, 1e30])
        r16 = torch.zeros(5, dtype=torch.int64)
        assert stochastic_round(x, "e4m3", r16).tolist() == [448.0, -448.0, 448.0, -448.0, 448.0]
        assert stochastic_round(x, "e2m1", r16).tolist() == [6.0, -6.0, 6.0, -6.0, 6.0]
        assert stochastic_round(x, "bf16", r16)[:2].tolist() == [math.inf, -math.inf]
        nan = torch.tensor([math.nan, -math.nan])
        signs = (f32_bits(nan) >> 31).tolist()
        r16 = torch.zeros(2, dtype=torch.int64)
        assert stochastic_round(nan, "e4m3", r16).isnan().all()
        assert stochastic_round(nan, "bf16", r16).isnan().all()
        assert (f32_bits(stochastic_round(nan, "bf16", r16)) >> 31).tolist() == signs
        assert stochastic_round(nan, "e2m1", r16).tolist() == [-6.0 if s else 6.0 for s in signs]

    def test_bf16_carry_into_exponent(self):
        x = torch.tensor([0x3FFFFFFF, 0x7F7FFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32)
        out = stochastic_round(x, "bf16", torch.zeros(2, dtype=torch.int64))
        assert out.tolist() == [2.0, math.inf]

    def test_bf16_compare_rule(self):
        x = sample_values("bf16", 5000, 12)
        r16 = uniform_r16(x.numel(), 13)
        bits = f32_bits(x)
        expected = (bits >> 16) + (r16 < (bits & 0xFFFF)).to(torch.int64)
        assert torch.equal(f32_bits(stochastic_round(x, "bf16", r16)) >> 16, expected)
        # The rounded values are exact in bf16, so encoding them is exact.
        out = stochastic_round(x, "bf16", r16)
        assert torch.equal(bf16_decode(bf16_encode(out)), out)

    @pytest.mark.parametrize(("fmt", "value"), [
        ("bf16", 1.0 + 2.0**-9), ("bf16", 3.0e-39), ("e4m3", 371.2), ("e4m3", 0.0103),
        ("e4m3", 2.0**-11), ("e4m3", 5e-4), ("e2m1", 0.3), ("e2m1", 2.7), ("e2m1", 0.1), ("e2m1", 5.5),
    ])
    def test_unbiased(self, fmt, value):
        n = 200_000
        x = torch.full((n,), value, dtype=torch.float32)
        out = stochastic_round(x, fmt, uniform_r16(n, 14)).double()
        lo, hi = neighbours(x[:1], fmt)
        step = float(hi - lo)
        # Mean error within 6 sigma of a Bernoulli(p) draw scaled by the step,
        # plus the 2^-16 quantisation of the rounding probability.
        tolerance = 6 * step * 0.5 / math.sqrt(n) + step * 2.0**-16
        assert abs(float(out.mean()) - float(x[0].double())) < tolerance
        assert set(out.unique().tolist()) <= {float(lo), float(hi)}

    def test_results_exact_in_target_format(self):
        x = sample_values("e4m3", 5000, 15)
        out = stochastic_round(x, "e4m3", uniform_r16(x.numel(), 16))
        assert torch.equal(out.to(torch.float8_e4m3fn).float(), out)
        assert torch.equal(e4m3_decode(out.to(torch.float8_e4m3fn).view(torch.uint8)), out)
        y = sample_values("e2m1", 5000, 17)
        out = stochastic_round(y, "e2m1", uniform_r16(y.numel(), 18))
        grid = e2m1_decode(torch.arange(16, dtype=torch.int64).to(torch.uint8))
        assert torch.isin(out, grid).all()

    def test_bad_format(self):
        with pytest.raises(ValueError):
            stochastic_round(torch.zeros(4), "fp16", torch.zeros(4, dtype=torch.int64))
