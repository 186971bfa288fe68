"""The correctly rounded log1p of the kernels (``vmi_core.tl.log1p``), bit for bit.

Reference: float64 ``log1p`` rounded once to binary32, except on the nine inputs where that is not
correctly rounded (``MISROUNDED``: the float64 result lies too close to a binary32 rounding boundary),
whose correctly rounded values come from mpmath. The exhaustive test finds every input whose float64
result lies within 2^-44 of a boundary, settles it with mpmath at 200 bits, and checks that exactly
those nine are misrounded.

The default run: the nine, the inputs nearest a rounding boundary, the special values and a seeded
sample, on cpu (scalar lanes in a vectorized loop) and ascend-sim (64-lane registers).
"""

from __future__ import annotations

import mpmath
import pytest
import torch

from vmi_core.compile import kernel_source
from vmi_core.tools import gen_constants
from vmi_core.tools.source_checks import cpu_vectorized_loops, transcendental_calls
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.lane_kernels import LaneMap, build_lane_map, misrounded, round_f32, run_lane_map

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


def test_constants_are_the_generators_output():
    assert gen_constants.LOG1P_TARGET.read_text() == gen_constants.render_log1p()


def test_cpu_loop_vectorizes_and_no_kernel_calls_a_library_log():
    spec = LaneMap("log1p", 1 << 16)
    loops = cpu_vectorized_loops(kernel_source(build_lane_map, spec, "cpu", simd_parallel=False))
    if loops is None:
        pytest.skip("no GCC to ask")
    assert any("i < 1024" in loop for loop in loops), loops  # the element loop
    for target in ("cpu", "cuda", "ascend"):
        assert transcendental_calls(kernel_source(build_lane_map, spec, target, simd_parallel=False)) == []


CHUNK = 1 << 24


@pytest.mark.exhaustive
def test_every_binary32_input():
    settled, wrong_oracle = 0, []
    for start in range(-(1 << 31), 1 << 31, CHUNK):
        x = torch.arange(start, start + CHUNK, dtype=torch.int64).to(torch.int32).view(torch.float32)
        y = run_lane_map("log1p", x, "cpu")[0]
        assert_bitwise_equal(y, oracle(x), f"log1p from {start:#x}", any_nan=True)
        count, wrong = misrounded(x, torch.log1p(x.double()), mpmath.log1p)
        settled += count
        wrong_oracle += [bits for bits, _ in wrong]
    print(f"{settled} inputs near a rounding boundary settled with mpmath")
    assert sorted(wrong_oracle) == sorted(MISROUNDED)
