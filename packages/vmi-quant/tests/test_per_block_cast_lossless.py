"""per_block_cast_lossless on the cpu and ascend-sim targets: bit for bit against the torch
reference, and lossless: ``cast_back(out, out_block) == cast_back(x, x_block)`` bit for bit.

Each option combination is one compiled kernel (token count, hidden size and strides are
runtime values); the default matrix is a covering set, a wider sweep runs under ``slow``.
ascend-sim (the AscendC the ``ascend`` target emits, on vmi-core's model of the vector core)
runs one ascend-flavor case, each shape under another pipe schedule (the one where every core
runs 12 / 3 tiles under both consumers_first and producers_first), and all of them under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_devkit.cases.pbcl_cases import COVERING, FULL, SIM_COVERING, SIM_FULL, case_id, sf_options
from vmi_quant import reference
from vmi_quant.ops.per_block_cast_lossless import per_block_cast_lossless, per_block_cast_lossless_parallel
from vmi_quant.reference.lossless import per_block_cast_lossless as reference_lossless

# (num_tokens, hidden): empty, and 1, 3 or 5 128-column tiles (packed SF rows with unused bytes).
SHAPES = [(0, 256), (128, 384), (384, 128), (256, 640)]
# ascend-sim (64 cores, 32- or 128-token x 128-column work tiles, 2 buffer versions); tiles of
# 32 / 128 tokens: 4 / 1 (most cores idle), 60 / 15, 768 / 192 (every core runs 12 / 3), 12 / 3.
# Shapes are multiples of 128, so tiles have no tails. Only (2048, 1536) makes cores reuse a buffer
# version, so it runs under both schedules that expose a missing wait (consumers first:
# read-after-write; producers first: write-after-read).
SIM_WIDE_SHAPE = (2048, 1536)
SIM_SHAPES = [(128, 128), (384, 640), SIM_WIDE_SHAPE, (128, 384)]


def _fp4_input(shape, seed, x_block, x_mode, flavor):
    """FP4 data whose block scales spread over ~9 binades: normal samples times 2^u (u in [-30, 30]),
    every magnitude raised to at least max|x| / 2^9 (so the re-quantization stays exact)."""
    g = generator(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 31, shape, generator=g).float())
    if x.numel():
        floor = x.abs().max() / 2**9
        x = torch.where(x.abs() < floor, torch.copysign(floor.expand_as(x), x), x)
    return reference.cast(x, "e2m1", x_block, flavor=flavor, **sf_options(x_mode))


def _check_case(x_block, x_mode, out_block, out_mode, flavor, shapes=SHAPES, *, target=None, offset=0):
    options = sf_options(out_mode)
    for seed, shape in enumerate(shapes):
        qx = _fp4_input(shape, seed, x_block, x_mode, flavor)
        ref_data, ref_sf = reference_lossless(qx, "e4m3", x_block, out_block, flavor=flavor, **options)
        wide = target == "ascend-sim" and shape == SIM_WIDE_SHAPE
        for schedule in REUSE_SCHEDULES if wide else [SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]]:
            with sim_schedule(schedule):
                data, sf = per_block_cast_lossless(qx, "e4m3", x_block, out_block, flavor=flavor, target=target,
                                                   **options)
            label = (f"{case_id((x_block, x_mode, out_block, out_mode, flavor))} shape={shape} target={target} "
                     f"schedule={schedule}")
            assert_bitwise_equal(data, ref_data, f"data [{label}]")
            assert_bitwise_equal(sf, ref_sf, f"sf [{label}]")
        # The kernel's output equals ref_data / ref_sf bit for bit, so the lossless check runs once.
        assert_bitwise_equal(reference.cast_back((data, sf), "fp32", out_block, flavor=flavor),
                             reference.cast_back(qx, "fp32", x_block, flavor=flavor), f"lossless [{label}]")


@pytest.mark.parametrize("case", COVERING, ids=case_id)
def test_matches_reference_and_is_lossless(case):
    _check_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_matches_reference_full(case):
    _check_case(*case)


@pytest.mark.parametrize("case", SIM_COVERING, ids=case_id)
def test_matches_reference_and_is_lossless_on_ascend_sim(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_COVERING.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL, ids=case_id)
def test_matches_reference_on_ascend_sim_full(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_FULL.index(case))


def _spread_input(binades: int):
    """Per-token FP4 input whose first two tokens' scales lie ``binades`` apart."""
    x = torch.ones(128, 128)
    x[1] = 2.0 ** -binades
    return reference.cast(x, "e2m1", (1, 32), round_sf=True)


def test_exponent_spread_limit():
    # Scales 11 binades apart are the widest spread one output block can hold.
    qx = _spread_input(11)
    data, sf = per_block_cast_lossless(qx, "e4m3", (1, 32), (32, 32), round_sf=True)
    assert_bitwise_equal(reference.cast_back((data, sf), "fp32", (32, 32)),
                         reference.cast_back(qx, "fp32", (1, 32)), "lossless at the limit")
    too_wide = _spread_input(12)
    with pytest.raises(ValueError, match="11 binades"):
        per_block_cast_lossless(too_wide, "e4m3", (1, 32), (32, 32), round_sf=True)
    with pytest.raises(ValueError, match="11 binades"):
        per_block_cast_lossless(too_wide, "e4m3", (1, 32), (32, 32), round_sf=True, target="torch")
    # Separate output blocks may differ by any amount.
    per_block_cast_lossless(too_wide, "e4m3", (1, 32), (1, 128), round_sf=True)


def test_negative_scale_is_rejected():
    data, sf = _spread_input(0)
    sf = sf.clone()
    sf[5, 1] = -sf[5, 1]
    with pytest.raises(ValueError, match="negative"):
        per_block_cast_lossless((data, sf), "e4m3", (1, 32), (32, 32), round_sf=True)


def test_torch_target_and_parallel_entry_point():
    qx = _fp4_input((128, 256), 9, (1, 32), "packed-col", "ascend")
    options = sf_options("packed-col")
    expected = reference_lossless(qx, "e4m3", (1, 32), (128, 128), **options)
    got = per_block_cast_lossless(qx, "e4m3", (1, 32), (128, 128), target="torch", **options)
    for a, b in zip(got, expected, strict=True):
        assert_bitwise_equal(a, b, "torch target")
    got = per_block_cast_lossless_parallel(qx, "e4m3", (1, 32), (128, 128), **options)
    for a, b in zip(got, expected, strict=True):
        assert_bitwise_equal(a, b, "parallel entry point")
    with pytest.raises(ValueError, match="target 'torch'"):
        per_block_cast_lossless_parallel(qx, "e4m3", (1, 32), (128, 128), target="torch", **options)
