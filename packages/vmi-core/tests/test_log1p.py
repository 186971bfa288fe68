"""The correctly rounded log1p of the kernels (``vmi_core.tl.log1p``), bit for bit.

Reference: float64 ``log1p`` rounded once to binary32, except on the nine inputs where that is not
correctly rounded (``MISROUNDED``: the float64 result lies too close to a binary32 rounding boundary),
whose correctly rounded values come from mpmath. The exhaustive test finds every input whose float64
result lies within 2^-44 of a boundary, settles it with mpmath at 200 bits, and checks that exactly
those nine are misrounded.

The default run: the nine, the inputs nearest a rounding boundary, the special values and a seeded
sample, on cpu (scalar lanes in a vectorized loop) and ascend-sim (64-lane registers). The torch twin
``vmi_core.fp32.log1p`` (float64 ``log1p`` rounded once, with the nine written down) must give the
same bits, here and on every input in the exhaustive run.
"""

from __future__ import annotations

import mpmath
import pytest
import torch

from vmi_core import fp32
from vmi_core.tools import gen_constants
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.lane_kernels import (
    assert_vectorized_without_transcendentals,
    every_binary32,
    misrounded,
    round_f32,
    run_lane_map,
)

MISROUNDED = (0x35400003, 0x3710001B, 0x3EFD81AD, 0x41078FEB, 0x65D890D3, 0x6F31A8EC, 0xB53FFFFD, 0xB70FFFE5,
              0xBB0EC8C4)
# ±0x1.800006p-21 lie 2^-66.4 (relative) from a rounding boundary, the closest of all inputs.
NEAREST = (0x35400003, 0xB5400003, 0x35400000, 0xB5400000)
SPECIAL = (0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x33800000, 0xB3800000, 0x337FFFFF,
           0x3C000000, 0xBC000000, 0x3BFFFFFF, 0xBF800000, 0xBF7FFFFF, 0xBF800001, 0xC0000000, 0x7F7FFFFF,
           0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC12345, 0x7F800001, 0x3F800000, 0x4B000000)
SAMPLE = {"cpu": 1 << 20, "ascend-sim": 1 << 14}


def _bits(values) -> torch.Tensor:
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int32)


def oracle(x: torch.Tensor) -> torch.Tensor:
    want = torch.log1p(x.double()).float()
    mpmath.mp.prec = 200
    for bits in MISROUNDED:
        hit = x.view(torch.int32) == _bits([bits])
        if bool(hit.any()):
            value = round_f32(mpmath.log1p(mpmath.mpf(float(_bits([bits]).view(torch.float32)))))
            want[hit] = value
    return want


def inputs(n: int) -> torch.Tensor:
    fixed = _bits(MISROUNDED + NEAREST + SPECIAL)
    rest = torch.randint(-(1 << 31), 1 << 31, (n - fixed.numel(),), generator=torch.Generator().manual_seed(6),
                         dtype=torch.int64).to(torch.int32)
    return torch.cat([fixed, rest]).view(torch.float32)


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_hard_special_and_sampled_inputs(target):
    x = inputs(SAMPLE[target])
    y = run_lane_map("log1p", x, target)[0]
    assert_bitwise_equal(y, oracle(x), f"log1p on {target}", any_nan=True)
    if target == "cpu":
        assert_bitwise_equal(fp32.log1p(x), y, "the torch twin fp32.log1p", any_nan=True)


def test_twin_corrections_are_mpmath_values():
    """``fp32.LOG1P_MISROUNDED`` lists the nine inputs, each with its correctly rounded result."""
    assert sorted(fp32.LOG1P_MISROUNDED) == sorted(MISROUNDED)
    x = _bits(MISROUNDED).view(torch.float32)
    want = oracle(x)
    assert_bitwise_equal(fp32.log1p(x), want, "fp32.log1p on the nine")
    assert not bool((torch.log1p(x.double()).float() == want).any()), "float64 log1p rounded once misrounds all nine"


def test_constants_are_the_generators_output():
    assert gen_constants.LOG1P_TARGET.read_text() == gen_constants.render_log1p()


def test_cpu_loop_vectorizes_and_no_kernel_calls_a_library_log():
    assert_vectorized_without_transcendentals("log1p")


@pytest.mark.exhaustive
def test_every_binary32_input():
    settled, wrong_oracle = 0, []
    for x in every_binary32():
        y = run_lane_map("log1p", x, "cpu")[0]
        assert_bitwise_equal(y, oracle(x), f"log1p from {float(x[0])}", any_nan=True)
        assert_bitwise_equal(fp32.log1p(x), y, f"fp32.log1p from {float(x[0])}", any_nan=True)
        count, wrong = misrounded(x, torch.log1p(x.double()), mpmath.log1p)
        settled += count
        wrong_oracle += [bits for bits, _ in wrong]
    print(f"{settled} inputs near a rounding boundary settled with mpmath")
    assert sorted(wrong_oracle) == sorted(MISROUNDED)
