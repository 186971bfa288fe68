"""cast_back / per_token_cast_back on the cpu and ascend-sim targets, bit for bit against the torch reference.

Each (data format, output format, SF layout, block) is one compiled kernel, so the
default matrix is the covering set of ``cast_cases``; the full product runs under the
``slow`` marker. Inputs come from the reference cast and from the per_token_cast kernel.
ascend-sim (the AscendC the ``ascend`` target emits, on vmi-core's model of the vector
core) runs a covering subset of the ascend-flavor cases, each shape under another pipe
schedule (the 258-tile one under both consumers_first and producers_first), and all of them
under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import (
    REUSE_SCHEDULES,
    SIM_SCHEDULES,
    assert_bitwise_equal,
    generator,
    randn,
    randn_with_ties,
    sim_schedule,
    with_extremes,
    with_zero_groups,
)
from vmi_devkit.cases.cast_cases import (
    CAST_BACK_COVERING,
    CAST_BACK_FULL,
    SIM_CAST_BACK_COVERING,
    SIM_CAST_BACK_FULL,
    case_id,
    sf_options,
)
from vmi_quant import per_token_cast, reference
from vmi_quant.ops.cast_back import cast_back, cast_back_parallel, per_token_cast_back, per_token_cast_back_parallel

# (num_tokens, hidden): empty, one token, tails of the 32-token and 128-channel tiles and of
# the blocks, and enough tokens for the cpu launcher to split rows over threads.
SHAPES = [(0, 128), (1, 64), (37, 192), (70, 320), (300, 256)]
# ascend-sim (64 cores, 32 x 128 work tiles, 2 buffer versions): one tile (63 idle cores), 4
# tiles with token and column tails, 129 x 2 = 258 tiles (every core runs 4 or 5), 9 tiles.
# Only the 258-tile shape makes cores reuse a buffer version, so it runs under both schedules
# that expose a missing wait (consumers first: read-after-write; producers first: write-after-read).
SIM_WIDE_SHAPE = (4100, 192)
SIM_SHAPES = [(1, 64), (37, 192), SIM_WIDE_SHAPE, (70, 320)]


def _values(shape, seed: int, group: int) -> torch.Tensor:
    x = randn_with_ties(shape, seed)
    if shape[0] and shape[1]:
        x = with_extremes(with_zero_groups(x, group, seed), seed)
    return x


def _check_case(fmt, block, sf_mode, col_major, out, flavor, shapes=SHAPES, *, target=None, offset=0):
    options = sf_options(sf_mode, col_major)
    variants = [options, {**options, "round_sf": True}] if sf_mode == "fp32" else [options]
    for seed, (m, k) in enumerate(shapes):
        cycled = SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]
        # The wide shape: the first variant under both schedules (the round_sf one runs the same
        # kernel, so it keeps the cycled one: a launch of this shape costs up to ~2.5 s).
        wide = target == "ascend-sim" and (m, k) == SIM_WIDE_SHAPE
        for i, opts in enumerate(variants):
            q = reference.cast(_values((m, k), seed, block[1]), fmt, block, flavor=flavor, **opts)
            want = reference.cast_back(q, out, block, flavor=flavor)
            for schedule in REUSE_SCHEDULES if wide and i == 0 else [cycled]:
                with sim_schedule(schedule):
                    y = cast_back(q, out, block, flavor=flavor, target=target)
                label = (f"{fmt} {block} sf={sf_mode} round={opts['round_sf']} col={col_major} ->{out} {flavor} "
                         f"{(m, k)} target={target} schedule={schedule}")
                assert_bitwise_equal(y, want, label)


@pytest.mark.parametrize("case", CAST_BACK_COVERING, ids=case_id)
def test_matches_reference(case):
    _check_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", CAST_BACK_FULL, ids=case_id)
def test_matches_reference_full(case):
    _check_case(*case)


@pytest.mark.parametrize("case", SIM_CAST_BACK_COVERING, ids=case_id)
def test_matches_reference_on_ascend_sim(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_CAST_BACK_COVERING.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_CAST_BACK_FULL, ids=case_id)
def test_matches_reference_on_ascend_sim_full(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_CAST_BACK_FULL.index(case))


PER_TOKEN = [case for case in CAST_BACK_COVERING if case[1][0] == 1]


@pytest.mark.parametrize("case", PER_TOKEN, ids=case_id)
def test_per_token_cast_input(case):
    # The spec's per-token test: quantize randn in the output dtype with the per_token_cast kernel.
    fmt, (_, npc), sf_mode, col_major, out, flavor = case
    for seed, (m, k) in enumerate([(1, 128), (70, 384), (300, 256)]):
        x = randn((m, k), seed, torch.float32 if out == "fp32" else torch.bfloat16)
        q = per_token_cast(x, fmt, npc, flavor=flavor, **sf_options(sf_mode, col_major))
        y = per_token_cast_back(q, out, npc, flavor=flavor)
        assert_bitwise_equal(y, reference.cast_back(q, out, (1, npc), flavor=flavor), f"{case} {(m, k)}")
        # Dequantization is close to the original (the spec's calc_diff bounds).
        xd, yd = x.double(), y.double()
        diff = 1 - 2 * (xd * yd).sum() / (xd * xd + yd * yd).sum()
        assert float(diff) < (2e-2 if fmt == "e2m1" or sf_mode == "e4m3" else 1e-3)


def _random_like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Random bit patterns of ``t``'s dtype and shape (NaN, inf, subnormal and negative SF included)."""
    size = t.element_size()
    raw = torch.randint(-(1 << (8 * size - 1)), 1 << (8 * size - 1), t.shape, generator=g, dtype=torch.int64)
    return raw.to({1: torch.int8, 2: torch.int16, 4: torch.int32}[size]).view(t.dtype)


@pytest.mark.parametrize("case", [CAST_BACK_COVERING[i] for i in (0, 2, 4, 7)], ids=case_id)
def test_arbitrary_bits(case):
    # Every data code (E4M3 NaNs included) times any stored SF: UE8M0 bytes 0 (0.0) and 255 (inf),
    # E4M3 NaN SF, fp32 NaN/inf/negative/subnormal SF.
    fmt, block, sf_mode, col_major, out, flavor = case
    g = generator(21)
    data, sf = reference.cast(randn((70, 320), 21), fmt, block, flavor=flavor, **sf_options(sf_mode, col_major))
    data.copy_(_random_like(data, g))
    sf.copy_(_random_like(sf, g))
    y = cast_back((data, sf), out, block, flavor=flavor)
    want = reference.cast_back((data, sf), out, block, flavor=flavor)
    # NaN times NaN: IEEE 754 leaves open which operand's payload (and sign) the product keeps.
    data_nan = (data.view(torch.uint8) & 0x7F) == 0x7F if fmt == "e4m3" else torch.zeros_like(y, dtype=torch.bool)
    ones = torch.full(data.shape, 0x38 if fmt == "e4m3" else 0x22, dtype=torch.uint8).view(data.dtype)  # 1.0
    sf_nan = reference.cast_back((ones, sf), "fp32", block, flavor=flavor).isnan()
    both = data_nan & sf_nan
    assert bool(y[both].float().isnan().all())
    assert_bitwise_equal(y[~both], want[~both], f"{case}")


# ascend-sim: a case of its default subset (FP4 data, SF packed along tokens).
@pytest.mark.parametrize("target,block,sf_mode,out", [(None, (32, 32), "fp32", "bf16"),
                                                      ("ascend-sim", (5, 1), "packed", "fp32")],
                         ids=["default", "ascend-sim"])
def test_strided_data_rows(target, block, sf_mode, out):
    x = randn((70, 256), 22)
    data, sf = reference.cast(x, "e2m1", block, **sf_options(sf_mode, False))
    padded = torch.zeros((70, 256), dtype=torch.int8)
    padded[:, :128] = data
    strided = padded[:, :128]
    assert not strided.is_contiguous()
    with sim_schedule("consumers_first"):
        y = cast_back((strided, sf), out, block, target=target)
    assert_bitwise_equal(y, cast_back((data, sf), out, block, target=target), "strided vs contiguous")
    assert_bitwise_equal(y, reference.cast_back((data, sf), out, block), "vs reference")


def test_empty_without_launch(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a kernel was compiled for an empty input")

    monkeypatch.setattr("vmi_core.kernel.cached_kernel", fail)
    q = reference.cast(torch.zeros(0, 128), "e4m3", (1, 32), round_sf=True, use_packed_ue8m0=True)
    y = per_token_cast_back(q, "fp32", 32)
    assert y.shape == (0, 128) and y.dtype == torch.float32


def test_torch_target_and_parallel_entries():
    x = randn((40, 192), 23)
    q = reference.cast(x, "e4m3", (1, 64), round_sf=True, use_packed_ue8m0=True, flavor="cuda")
    want = reference.cast_back(q, "bf16", (1, 64), flavor="cuda")
    assert_bitwise_equal(per_token_cast_back(q, "bf16", 64, target="torch", flavor="cuda"), want, "torch target")
    assert_bitwise_equal(cast_back_parallel(q, "bf16", (1, 64), flavor="cuda"), want, "cast_back_parallel")
    assert_bitwise_equal(per_token_cast_back_parallel(q, "bf16", 64, flavor="cuda"), want, "per_token parallel")
    with pytest.raises(ValueError, match="target 'torch'"):
        cast_back_parallel(q, "bf16", (1, 64), target="torch", flavor="cuda")
    # Any group width, as cast_back's blocks (the quantizing ops' 16..128 is their kernels' limit).
    wide = reference.cast(x, "e4m3", (1, 192), round_sf=True)
    assert_bitwise_equal(per_token_cast_back(wide, "bf16", 192, target="torch"),
                         reference.cast_back(wide, "bf16", (1, 192)), "a group of 192")
