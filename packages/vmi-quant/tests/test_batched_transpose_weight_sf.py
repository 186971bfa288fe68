"""batched_transpose_weight_sf on the cpu and ascend-sim targets, bit for bit against the torch
reference: both block sizes and flavors, 2-D and 3-D scales, transposed or not, and a second
round that rewrites the scales in place and reuses the first round's outputs.

The weights are the specification's list (``slow``), shrunk for the default run; the scales come
from a power-of-two per-block cast of random data, with some blocks +0.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, SIM_SCHEDULES, assert_bitwise_equal, generator, sim_schedule
from vmi_quant import reference
from vmi_quant.ops.batched_transpose_weight_sf import batched_transpose_weight_sf, batched_transpose_weight_sf_parallel

# (n, k, G, transpose_sf1): the specification's weight list.
FULL_WEIGHTS = [(128, 128, None, False), (384, 512, 2, True), (768, 1152, 3, False), (640, 1280, 1, True),
                (2048, 2560, 2, False), (384, 384, None, True), (6144, 4096, None, False)]
# Every kind of weight at small sizes: 2-D and 3-D, odd scale counts (pad bytes), several tiles.
WEIGHTS = [(128, 128, None, False), (384, 512, 2, True), (640, 1152, 1, False), (384, 384, None, True)]
SIM_WEIGHTS = [(128, 384, None, True), (640, 1152, 2, False)]
# 22 x 2 x 3 = 132 work tiles of 16 x 16 scales (bs 32) over 64 cores: core 0 runs 3, more than its
# 2 buffer versions, so a missing wait between pipes shows up under consumers_first or
# producers_first.
SIM_WRAPPING_WEIGHTS = [(640, 1152, 22, False), (640, 1152, 22, True)]


def _scales(weight, block_size, seed):
    n, k, groups, _ = weight
    g = generator(seed)
    x = torch.rand(((groups or 1) * n, k), generator=g) * torch.exp2(torch.randint(-20, 21, (1, k), generator=g))
    x[torch.rand((x.shape[0] // block_size, 1), generator=g).repeat_interleave(block_size, 0)[:, 0] < 0.1] = 0.0
    _, sf = reference.cast(x, "e4m3", (block_size, block_size), round_sf=True)
    return sf.view(groups, n // block_size, k // block_size) if groups else sf


def _drawn_scales(weight, block_size, seed):
    """Scales drawn directly (a cast of the whole weight is too slow at this size): powers of two
    from 2^-40 to 2^20, about one in ten +0."""
    n, k, groups, _ = weight
    g = generator(seed)
    shape = (groups, n // block_size, k // block_size)
    sf = torch.exp2(torch.randint(-40, 21, shape, generator=g).float())
    return torch.where(torch.rand(shape, generator=g) < 0.1, 0.0, sf)


def _check(weights, block_size, flavor, *, target=None, seed=0):
    sf = [_scales(w, block_size, seed + i) for i, w in enumerate(weights)]
    transpose = [w[3] for w in weights]
    schedule = SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]
    with sim_schedule(schedule):
        first = batched_transpose_weight_sf(sf, block_size, transpose, target=target, flavor=flavor)
    _compare(first, reference.batched_transpose_weight_sf(sf, block_size, transpose, flavor=flavor or "ascend"),
             f"round 1 bs={block_size} flavor={flavor} target={target}")
    # Round 2: new scales in the same tensors; every weight but the first reuses its outputs.
    for i, (s, w) in enumerate(zip(sf, weights, strict=True)):
        s.copy_(_scales(w, block_size, seed + 100 + i))
    with sim_schedule(schedule):
        second = batched_transpose_weight_sf(sf, block_size, transpose, [None, *first[1:]], target=target,
                                             flavor=flavor)
    for got, reused in zip(second[1:], first[1:], strict=True):
        assert got[0] is reused[0] and got[1] is reused[1]
        assert got[0].data_ptr() == reused[0].data_ptr() and got[1].data_ptr() == reused[1].data_ptr()
    _compare(second, reference.batched_transpose_weight_sf(sf, block_size, transpose, flavor=flavor or "ascend"),
             f"round 2 bs={block_size} flavor={flavor} target={target}")
    return second


def _compare(got, expected, label):
    assert len(got) == len(expected)
    for i, (pair, want) in enumerate(zip(got, expected, strict=True)):
        for name, out, ref in zip(("sf0", "sf1"), pair, want, strict=True):
            assert out.data_ptr() % 32 == 0, f"{name} of weight {i} is not 32-byte aligned [{label}]"
            assert (out.shape, out.stride()) == (ref.shape, ref.stride()), f"{name} of weight {i} [{label}]"
            assert_bitwise_equal(out, ref, f"{name} of weight {i} [{label}]")


# Each (block size, flavor) is a kernel of its own: the default run compiles two that cover both
# block sizes and both word types, the slow run the other two.
@pytest.mark.parametrize("block_size, flavor", [
    (32, "ascend"), (128, "cuda"),
    pytest.param(128, "ascend", marks=pytest.mark.slow), pytest.param(32, "cuda", marks=pytest.mark.slow),
])
def test_matches_reference(block_size, flavor):
    _check(WEIGHTS, block_size, flavor)


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
@pytest.mark.parametrize("block_size", [32, 128])
def test_matches_reference_full(block_size, flavor):
    _check(FULL_WEIGHTS, block_size, flavor)


def test_matches_reference_on_ascend_sim():
    """Also the status word of the ascend source: a bad scale raises naming its weight, and the
    reused outputs stay as they were (the default run's one ascend-sim test: one lowering)."""
    outs = _check(SIM_WEIGHTS, 32, None, target="ascend-sim", seed=1)
    sf = [_scales(w, 32, 10 + i) for i, w in enumerate(SIM_WEIGHTS)]
    sf[1][1, 3, 2] = 3.0
    before = [t.clone() for pair in outs for t in pair]
    with pytest.raises(ValueError, match=r"sf\[1\] must hold \+0 or positive powers of two"):
        batched_transpose_weight_sf(sf, 32, [w[3] for w in SIM_WEIGHTS], outs, target="ascend-sim")
    for i, (old, new) in enumerate(zip(before, [t for pair in outs for t in pair], strict=True)):
        assert_bitwise_equal(new, old, f"reused output {i}")
    # More tiles on a core than buffer versions, one launch under each of the two schedules.
    for seed, (schedule, weight) in enumerate(zip(REUSE_SCHEDULES, SIM_WRAPPING_WEIGHTS,
                                                  strict=True)):
        sf = [_drawn_scales(weight, 32, 20 + seed)]
        with sim_schedule(schedule):
            got = batched_transpose_weight_sf(sf, 32, [weight[3]], target="ascend-sim")
        _compare(got, reference.batched_transpose_weight_sf(sf, 32, [weight[3]], flavor="ascend"),
                 f"weight {weight} schedule={schedule}")


@pytest.mark.slow
def test_matches_reference_on_ascend_sim_block_128():
    _check(SIM_WEIGHTS, 128, None, target="ascend-sim", seed=2)


def test_fresh_outputs_share_one_pool():
    sf = [_scales(w, 32, i) for i, w in enumerate(WEIGHTS)]
    outs = batched_transpose_weight_sf(sf, 32, [w[3] for w in WEIGHTS])
    flat = [t for pair in outs for t in pair]
    assert all(t.untyped_storage().data_ptr() == flat[0].untyped_storage().data_ptr() for t in flat)
    offsets = [t.storage_offset() for t in flat]
    assert offsets[0] == 0 and all(o % 128 == 0 for o in offsets)
    assert [b - a for a, b in zip(offsets, offsets[1:], strict=False)] == [t.numel() for t in flat[:-1]]


def test_empty_sequence():
    assert batched_transpose_weight_sf([], 32, []) == []
    assert batched_transpose_weight_sf([], 128, [], [], target="torch") == []


def test_zero_scales_and_extremes():
    """+0 gives byte 0; the smallest and largest normal powers of two give bytes 1 and 254."""
    sf = torch.zeros(4, 4)
    sf[0, 1], sf[2, 3] = 2.0**-126, 2.0**127
    (sf0, sf1), = batched_transpose_weight_sf([sf], 32, [True])
    assert sf0[0, 0].item() & 0xFFFF == 1 << 8 and sf0[64, 1].item() & 0xFFFF == 254 << 8
    assert sf1[0, 32].item() == 1 and sf1[1, 96].item() == 254
    assert_bitwise_equal(sf0, reference.batched_transpose_weight_sf([sf], 32, [True])[0][0], "sf0")


def test_parallel_entry_refuses_the_reference():
    sf = [_scales(WEIGHTS[0], 32, 0)]
    assert_bitwise_equal(batched_transpose_weight_sf_parallel(sf, 32, [False])[0][1],
                         batched_transpose_weight_sf(sf, 32, [False], target="torch")[0][1], "sf1")
    with pytest.raises(ValueError, match="always runs the kernel"):
        batched_transpose_weight_sf_parallel(sf, 32, [False], target="torch")
