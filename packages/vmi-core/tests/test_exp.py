"""The correctly rounded exp of the kernels (``vmi_core.tl.exp``, called as ``vmi_core.tl.elementary``'s
functions), bit for bit.

Reference: float64 ``exp`` rounded once to binary32 (``vmi_core.fp32.exp``), which is correctly
rounded for every binary32 input: the exhaustive test finds every input whose float64 result lies
within 2^-44 (relative) of a binary32 rounding boundary and settles it with mpmath at 200 bits.

The default run: the inputs the fast path flags (``data/exp_hard_inputs.txt``), the special values
and a seeded sample, through a cpu kernel (scalar lanes in a vectorized loop) and an ascend-sim
kernel (a SIMT region), and on cpu through ``Shell.exp`` (a tile at a time: the exact evaluation
only for tiles with a hard lane). ``nox -s exhaustive``: every binary32 input on cpu, both forms.
"""

from __future__ import annotations

from pathlib import Path

import mpmath
import pytest
import torch

from vmi_core.compile import kernel_source
from vmi_core.tools import gen_constants
from vmi_core.tools.source_checks import transcendental_calls
from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.lane_kernels import (
    ExpTile,
    assert_vectorized_without_transcendentals,
    build_exp_tile,
    every_binary32,
    exp_tile_cpu_loops,
    misrounded,
    run_exp_tile,
    run_lane_map,
)

HARD = Path(__file__).parent / "data" / "exp_hard_inputs.txt"
SPECIAL = (0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x33000000, 0xB3800000,
           0x3F800000, 0xBF800000, 0x42B17217, 0x42B17218, 0xC2AEAC50, 0xC2AEAC4F, 0xC2CFFFFF, 0xC2D00000,
           0xC2D00001, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC12345, 0x7F800001)
SAMPLE = {"cpu": 1 << 20, "ascend-sim": 1 << 14}


def _bits(values) -> torch.Tensor:
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int32)


def hard_inputs() -> list[int]:
    return [int(line, 16) for line in HARD.read_text().split("\n") if line and not line.startswith("#")]


def oracle(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x.double()).float()


def inputs(n: int) -> torch.Tensor:
    """The hard inputs, the specials, then seeded random bit patterns: ``n`` floats."""
    fixed = _bits(hard_inputs() + list(SPECIAL))
    rest = torch.randint(-(1 << 31), 1 << 31, (n - fixed.numel(),), generator=torch.Generator().manual_seed(5),
                         dtype=torch.int64).to(torch.int32)
    return torch.cat([fixed, rest]).view(torch.float32)


def check(x: torch.Tensor, target: str) -> torch.Tensor:
    """exp, its fast path where it does not flag, and the exact path, against the oracle; returns
    the flags."""
    y, fast, hard, exact = run_lane_map("exp_parts", x, target)
    want = oracle(x)
    assert_bitwise_equal(y, want, f"vmi_exp on {target}", any_nan=True)
    assert_bitwise_equal(exact, want, f"exp_exact on {target}", any_nan=True)
    easy = hard == 0
    assert_bitwise_equal(fast[easy], want[easy], f"exp_with_flag's unflagged lanes on {target}", any_nan=True)
    return hard.bool()


@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_hard_special_and_sampled_inputs(target):
    x = inputs(SAMPLE[target])
    flagged = check(x, target)
    listed = len(hard_inputs())
    assert bool(flagged[:listed].all()), "every listed hard input is flagged"
    assert not bool(flagged[listed:].any()), "no input outside the list is flagged"


def test_exp_tile_on_cpu():
    """The hard inputs and the specials fill the first tile (its second pass runs); the sampled
    inputs fill tiles that almost surely have no hard lane (the second pass is skipped)."""
    x = inputs(SAMPLE["cpu"])
    assert_bitwise_equal(run_exp_tile(x, "cpu"), oracle(x), "Shell.exp on cpu", any_nan=True)


def test_exp_tile_passes_vectorize_and_the_exact_pass_runs_only_for_marked_tiles():
    assert transcendental_calls(kernel_source(build_exp_tile, ExpTile(1 << 16), "cuda", simd_parallel=False)) == []
    loops = exp_tile_cpu_loops()
    if loops is None:
        pytest.skip("GCC is not installed: the vectorizer report that shows the cpu loops vectorize is unavailable")
    assert any(loop.startswith("for (int32_t i = 0; i < 1024; ++i) { y[i] = vmi_exp_fast_or_mark(x[i]);")
               for loop in loops), loops
    assert any("marked[0] = (marked[0] + " in loop for loop in loops), loops
    source = kernel_source(build_exp_tile, ExpTile(1 << 16), "cpu", simd_parallel=False)
    assert "if (marked[0] != 0) {" in source


def test_constants_are_the_generators_output():
    assert gen_constants.TARGET.read_text() == gen_constants.render()


def test_cpu_loop_vectorizes_and_no_kernel_calls_a_library_exp():
    assert_vectorized_without_transcendentals("exp_parts")


# --- every input ----------------------------------------------------------------------------------

@pytest.mark.exhaustive
def test_every_binary32_input():
    flagged, settled = [], 0
    for x in every_binary32():
        flagged += (x.view(torch.int32)[check(x, "cpu")].to(torch.int64) & 0xFFFFFFFF).tolist()
        assert_bitwise_equal(run_exp_tile(x, "cpu"), oracle(x), "Shell.exp on cpu", any_nan=True)
        count, wrong = misrounded(x, torch.exp(x.double()), mpmath.exp)
        assert wrong == [], "the float64 oracle misrounds"
        settled += count
    print(f"{settled} inputs near a rounding boundary settled with mpmath; {len(flagged)} flagged")
    assert sorted(flagged) == sorted(hard_inputs())
