"""The testing helpers (vmi_core.tools.testing): bitwise comparison and seeded generators."""

from __future__ import annotations

import math

import pytest
import torch

from vmi_core.formats import e2m1_decode, e4m3_decode, f32_from_bits
from vmi_core.tools.testing import (
    assert_bitwise_equal,
    bits,
    bitwise_mismatches,
    compare_named,
    generator,
    randn,
    randn_with_ties,
    with_extremes,
    with_zero_groups,
)


def nan_with_payload(payload: int) -> torch.Tensor:
    return f32_from_bits(torch.tensor([0x7F800000 | payload]))


class TestAssertBitwiseEqual:
    def test_equal_passes(self):
        x = torch.tensor([0.0, -0.0, math.inf, math.nan, 1.5])
        assert_bitwise_equal(x, x.clone())

    def test_signed_zero(self):
        with pytest.raises(AssertionError) as info:
            assert_bitwise_equal(torch.tensor([1.0, -0.0]), torch.tensor([1.0, 0.0]), "out")
        message = str(info.value)
        assert message.startswith("out: bit patterns differ")
        assert "at (1,)" in message
        assert "actual -0.0 (0x80000000)" in message and "expected 0.0 (0x00000000)" in message

    def test_nan_payload(self):
        with pytest.raises(AssertionError, match="0x7fc00001.*0x7fc00000"):
            assert_bitwise_equal(nan_with_payload(0x400001), nan_with_payload(0x400000))
        assert_bitwise_equal(nan_with_payload(0x400001), nan_with_payload(0x400001))

    def test_dtype(self):
        with pytest.raises(AssertionError, match="x: dtype torch.float32 != expected torch.float64"):
            assert_bitwise_equal(torch.zeros(2), torch.zeros(2, dtype=torch.float64), "x")

    def test_shape(self):
        with pytest.raises(AssertionError, match=r"shape \(2, 3\) != expected \(3, 2\)"):
            assert_bitwise_equal(torch.zeros(2, 3), torch.zeros(3, 2))

    def test_stride(self):
        a = torch.zeros(3, 2)
        b = torch.zeros(2, 3).t()
        with pytest.raises(AssertionError, match=r"strides \(2, 1\) != expected \(1, 3\)"):
            assert_bitwise_equal(a, b)
        assert_bitwise_equal(a, b, check_stride=False)
        assert_bitwise_equal(torch.zeros(0, 3), torch.zeros(3, 0).t())  # empty: strides not compared

    def test_message_lists_index_values_and_bits(self):
        actual = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        expected = actual.clone()
        expected[1, 2] = 2.5
        expected[2, 3] = -1.0
        with pytest.raises(AssertionError) as info:
            assert_bitwise_equal(actual, expected, "grid")
        lines = str(info.value).splitlines()
        assert lines[1] == "  at (1, 2): actual 6.0 (0x40c00000), expected 2.5 (0x40200000)"
        assert lines[2] == "  at (2, 3): actual 11.0 (0x41300000), expected -1.0 (0xbf800000)"

    def test_message_is_capped(self):
        lines = bitwise_mismatches(torch.zeros(100), torch.ones(100), limit=8)
        assert len(lines) == 9 and lines[-1] == "  ... 92 more of 100 elements differ"

    def test_narrow_dtypes(self):
        a = torch.tensor([1.0, 2.0]).to(torch.bfloat16)
        b = torch.tensor([1.0, 2.015625]).to(torch.bfloat16)
        with pytest.raises(AssertionError, match=r"\(0x4000\).*\(0x4001\)"):
            assert_bitwise_equal(a, b)
        c = torch.tensor([0x38, 0x39], dtype=torch.uint8).view(torch.float8_e4m3fn)
        with pytest.raises(AssertionError, match=r"\(0x38\).*\(0x39\)"):
            assert_bitwise_equal(c, c.view(torch.uint8).flip(0).view(torch.float8_e4m3fn))
        with pytest.raises(AssertionError, match=r"actual -1 \(0xffff\), expected 1 \(0x0001\)"):
            assert_bitwise_equal(torch.tensor([-1], dtype=torch.int16), torch.tensor([1], dtype=torch.int16))

    def test_non_contiguous_inputs(self):
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        assert_bitwise_equal(x.t(), x.clone().t())
        y = x.t().clone()
        y[2, 1] = -0.0
        with pytest.raises(AssertionError, match=r"at \(2, 1\)"):
            assert_bitwise_equal(x.t(), y, check_stride=False)

    def test_bits(self):
        assert bits(torch.tensor([-0.0])).dtype == torch.int32
        assert int(bits(torch.tensor([-0.0]))[0]) == -(2**31)
        assert bits(torch.tensor([1], dtype=torch.uint16)).dtype == torch.int16
        ints = torch.tensor([3, 4])
        assert bits(ints) is ints


class TestGenerators:
    def test_reproducible_from_seed(self):
        for make in (lambda s: randn((7, 9), s), lambda s: randn_with_ties((7, 9), s),
                     lambda s: with_zero_groups(randn((8, 64), 0), 16, s),
                     lambda s: with_extremes(randn(500, 0), s)):
            assert_bitwise_equal(make(3), make(3))
            assert not torch.equal(make(3), make(4))
        assert torch.equal(torch.rand(4, generator=generator(5)), torch.rand(4, generator=generator(5)))

    def test_dtype(self):
        assert randn((4,), 0, torch.bfloat16).dtype == torch.bfloat16
        assert randn_with_ties((4,), 0, torch.bfloat16).dtype == torch.bfloat16

    def test_ties_really_contain_midpoints(self):
        x = randn_with_ties((64, 64), 1).flatten().double()
        e4 = e4m3_decode(torch.arange(0x7F, dtype=torch.uint8)).double()  # 0 .. 448
        e2 = e2m1_decode(torch.arange(8, dtype=torch.uint8)).double()  # 0 .. 6
        mid_e4 = torch.isin(x.abs(), (e4[:-1] + e4[1:]) / 2)
        mid_e2 = torch.isin(x.abs(), (e2[:-1] + e2[1:]) / 2)
        assert float(mid_e4.double().mean()) > 0.05, "too few E4M3 rounding midpoints"
        assert float(mid_e2.double().mean()) > 0.02, "too few E2M1 rounding midpoints"
        assert bool((x[mid_e4] < 0).any() and (x[mid_e4] > 0).any())
        # The rest is plain normal noise (no other value sits on a midpoint by chance).
        assert float((mid_e4 | mid_e2).double().mean()) < 0.3

    def test_zero_groups(self):
        x = randn((32, 64), 2)
        y = with_zero_groups(x, 16, 3)
        groups = y.reshape(32, 4, 16)
        zero = (groups == 0).all(dim=2)
        assert 0 < int(zero.sum()) < 128
        assert bool(torch.signbit(groups[zero]).any()), "no negative zeros"
        kept = ~zero.unsqueeze(2).expand_as(groups)
        assert torch.equal(groups[kept], x.reshape(32, 4, 16)[kept])

    def test_extremes(self):
        x = randn(6400, 4)
        y = with_extremes(x, 5)
        assert float(y.abs().max()) > 1e25
        tiny = (y != 0) & (y.abs() < 1.1754944e-38)
        assert int(tiny.sum()) > 0, "no fp32 subnormals"
        assert int((y != x).sum()) <= 100


def test_compare_named():
    check = compare_named(("a", "b"))
    a, b = torch.arange(4.0), torch.zeros(2, dtype=torch.int64)
    assert check((a, b), (a.clone(), b.clone())) == []
    lines = check((a, b.int()), (a + torch.tensor([0.0, 0.0, 1.0, 0.0]), b))
    assert lines[0].startswith("  a") and any(line.startswith("  b: torch.int32") for line in lines)
