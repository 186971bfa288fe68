"""per_token_cast_and_cast_back on the cpu and ascend-sim targets, bit for bit against the
torch reference (``reference.cast`` then ``reference.cast_back``).

Each option combination is one compiled kernel (token count, hidden size and the row
stride are runtime values); the default matrix is a covering set, the full product runs
under the ``slow`` marker. ascend-sim (the AscendC the ``ascend`` target emits, on
vmi-core's model of the vector core) runs a covering subset, each shape under another
pipe schedule (the 258- or 387-tile one under both consumers_first and producers_first), and
every case under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import (
    REUSE_SCHEDULES,
    SIM_SCHEDULES,
    assert_bitwise_equal,
    randn,
    randn_with_ties,
    sim_schedule,
    with_extremes,
    with_zero_groups,
)
from vmi_devkit.cases.ptccb_cases import COVERING, DTYPES, FULL, SF_MODES, SIM_COVERING, SIM_FULL, hidden_unit
from vmi_quant import reference
from vmi_quant.ops.per_token_cast_and_cast_back import (
    per_token_cast_and_cast_back,
    per_token_cast_and_cast_back_parallel,
)

# (num_tokens, hidden in units of hidden_unit(npc)): empty, one token, tails of the 32-token
# tile, partial 128-column tiles (npc <= 64), and enough tokens to split across CPU threads.
SHAPES = [(0, 2), (1, 1), (37, 3), (70, 5), (300, 2)]
# ascend-sim (64 cores, 32 x 128 work tiles, 2 buffer versions): one tile (63 idle cores), 4 or
# 6 tiles with token and column tails, 258 or 387 tiles (every core runs at least 4), 9 or 15.
# Only (4100, 3) makes cores reuse a buffer version, so it runs under both schedules that expose
# a missing wait (consumers first: read-after-write; producers first: write-after-read).
SIM_WIDE_SHAPE = (4100, 3)
SIM_SHAPES = [(1, 1), (37, 3), SIM_WIDE_SHAPE, (70, 5)]


def _reference(x, fmt, npc, round_sf, use_e4m3_sf):
    in_fmt = "bf16" if x.dtype == torch.bfloat16 else "fp32"
    quantized = reference.cast(x, fmt, (1, npc), round_sf=round_sf, use_e4m3_sf=use_e4m3_sf)
    return reference.cast_back(quantized, in_fmt, (1, npc))


def _inputs(shape, dtype, seed, group):
    x = randn_with_ties(shape, seed, torch.float32)
    if shape[0] and shape[1]:
        x = with_extremes(with_zero_groups(x, group, seed), seed)
    return x.to(dtype)


def _check_case(in_dtype, fmt, npc, sf_mode, shapes=SHAPES, *, target=None, offset=0):
    round_sf, use_e4m3_sf = SF_MODES[sf_mode]
    # The round trip has no flavor-dependent bits: both flavors must give the reference
    # (ascend-sim has only its own, ascend).
    flavors = ("ascend",) if target == "ascend-sim" else ("ascend", "cuda")
    for seed, (m, units) in enumerate(shapes):
        shape = (m, units * hidden_unit(npc))
        x = _inputs(shape, DTYPES[in_dtype], seed, npc)
        expected = _reference(x, fmt, npc, round_sf, use_e4m3_sf)
        wide = target == "ascend-sim" and (m, units) == SIM_WIDE_SHAPE
        for schedule in REUSE_SCHEDULES if wide else [SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]]:
            label = f"{in_dtype}->{fmt} npc={npc} sf={sf_mode} shape={shape} target={target} schedule={schedule}"
            for flavor in flavors:
                y = x.clone()
                with sim_schedule(schedule):
                    assert per_token_cast_and_cast_back(y, fmt, npc, round_sf, use_e4m3_sf, target=target,
                                                        flavor=flavor) is None
                assert_bitwise_equal(y, expected, f"{label} {flavor}")


@pytest.mark.parametrize("case", COVERING, ids=lambda c: "-".join(map(str, c)))
def test_matches_reference(case):
    _check_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=lambda c: "-".join(map(str, c)))
def test_matches_reference_full(case):
    _check_case(*case)


# The first covering case on the simulator by default, the others in the slow run.
SIM_DEFAULT = [pytest.param(c, marks=[pytest.mark.slow] if i else []) for i, c in enumerate(SIM_COVERING)]


@pytest.mark.parametrize("case", SIM_DEFAULT, ids=lambda c: "-".join(map(str, c)))
def test_matches_reference_on_ascend_sim(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_COVERING.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL, ids=lambda c: "-".join(map(str, c)))
def test_matches_reference_on_ascend_sim_full(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_FULL.index(case))


@pytest.mark.slow
def test_large_shape():
    _check_case("bf16", "e2m1", 32, "pow2", shapes=[(4096, 7168 // 64)])


@pytest.mark.parametrize("target,case", [(None, COVERING[0]), (None, COVERING[3]), ("ascend-sim", COVERING[3])],
                         ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else v or "default")
def test_noncontiguous_rows_leave_padding_untouched(target, case):
    in_dtype, fmt, npc, sf_mode = case
    round_sf, use_e4m3_sf = SF_MODES[sf_mode]
    k = 320
    base = _inputs((45, 2 * k), DTYPES[in_dtype], 7, npc)
    original = base.clone()
    x = base[:, :k]
    assert not x.is_contiguous()
    expected = x.contiguous()
    per_token_cast_and_cast_back(expected, fmt, npc, round_sf, use_e4m3_sf, target=target)
    assert_bitwise_equal(expected, _reference(x, fmt, npc, round_sf, use_e4m3_sf), "contiguous rows vs reference")
    with sim_schedule("producers_first"):
        per_token_cast_and_cast_back(x, fmt, npc, round_sf, use_e4m3_sf, target=target)
    assert_bitwise_equal(x, expected, "strided rows", check_stride=False)
    assert_bitwise_equal(base[:, k:], original[:, k:], "padding columns")


def _calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    return 0.0 if denominator == 0 else float(1 - 2 * (x * y).sum() / denominator)


@pytest.mark.parametrize("in_dtype,fmt,npc,sf_mode", COVERING[:4])
def test_round_trip_stays_close(in_dtype, fmt, npc, sf_mode):
    # RNE is deterministic, so the round trip is not unbiased; it must only stay close.
    # E2M1 (and an E4M3-rounded scale) lose about 2 bits more than E4M3 data with an fp32 scale.
    round_sf, use_e4m3_sf = SF_MODES[sf_mode]
    x = randn((256, 512), 31, DTYPES[in_dtype])
    y = x.clone()
    per_token_cast_and_cast_back(y, fmt, npc, round_sf, use_e4m3_sf)
    bound = 2e-2 if fmt == "e2m1" or use_e4m3_sf else 1e-3
    assert _calc_diff(y, x) < bound
    assert not torch.equal(y, x)


def test_torch_target_and_parallel_entry_point():
    x = randn((20, 256), 19, torch.bfloat16)
    expected = _reference(x, "e4m3", 32, False, False)
    y = x.clone()
    per_token_cast_and_cast_back(y, "e4m3", 32, target="torch")
    assert_bitwise_equal(y, expected, "torch target")
    z = x.clone()
    assert per_token_cast_and_cast_back_parallel(z, "e4m3", 32) is None
    assert_bitwise_equal(z, expected, "parallel entry point")
    with pytest.raises(ValueError, match="target 'torch'"):
        per_token_cast_and_cast_back_parallel(x, "e4m3", 32, target="torch")
