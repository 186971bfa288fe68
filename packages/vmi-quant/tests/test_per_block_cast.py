"""per_block_cast (+ sf-only and precomputed-SF modes) on the cpu and ascend-sim targets, bit
for bit against the torch reference ``reference.cast(x, fmt, (bm, bk), ...)``.

Each option combination is one compiled kernel (token count, hidden size and strides are
runtime values); the default matrix is a covering set, the full product runs under ``slow``.
ascend-sim (the AscendC the ``ascend`` target emits, on vmi-core's model of the vector core)
runs a covering subset of the ascend-flavor cases, each shape under another pipe schedule (the
one where every core runs 3 / 12 tiles under both consumers_first and producers_first), and all
of them under ``slow``.
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
from vmi_devkit.cases.pbc_cases import COVERING, DTYPES, FULL, SIM_COVERING, SIM_FULL, case_id, sf_options
from vmi_quant import reference
from vmi_quant.ops.per_block_cast import (
    per_block_cast,
    per_block_cast_parallel,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)

# (num_tokens, hidden): empty, one and several block rows, and 3 or 5 128-column tiles, so
# that packed SF rows end in unused bytes (K/bk = 3 or 5 exponents per row).
SHAPES = [(0, 640), (128, 384), (384, 128), (384, 640)]
# ascend-sim (64 cores, one block row x 128 columns a work tile, 2 buffer versions); tiles with
# 128- / 32-row blocks: 1 / 4 (most cores idle), 15 / 60, 192 / 768 (every core runs 3 / 12),
# 3 / 12. Shapes are multiples of 128, so tiles have no tails. Only (2048, 1536) makes cores reuse
# a buffer version, so it runs under both schedules that expose a missing wait (consumers first:
# read-after-write; producers first: write-after-read).
SIM_WIDE_SHAPE = (2048, 1536)
SIM_SHAPES = [(128, 128), (384, 640), SIM_WIDE_SHAPE, (128, 384)]


def _schedule(seed, offset):
    """The ascend-sim pipe schedule of a case's ``seed``-th shape (``offset``: the case's index)."""
    return SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]


def _inputs(shape, dtype, seed, group):
    x = randn_with_ties(shape, seed, torch.float32)
    if shape[0]:
        x = with_extremes(with_zero_groups(x, group, seed), seed)
    return x.to(dtype)


def _check_case(in_dtype, fmt, block, sf_mode, col_major, flavor, shapes=SHAPES, *, target=None, offset=0):
    options = sf_options(sf_mode, col_major)
    for seed, shape in enumerate(shapes):
        x = _inputs(shape, DTYPES[in_dtype], seed, block[1])
        ref_data, ref_sf = reference.cast(x, fmt, block, flavor=flavor, **options)
        wide = target == "ascend-sim" and shape == SIM_WIDE_SHAPE
        for schedule in REUSE_SCHEDULES if wide else [_schedule(seed, offset)]:
            with sim_schedule(schedule):
                data, sf = per_block_cast(x, fmt, block, flavor=flavor, target=target, **options)
            label = (f"{case_id((in_dtype, fmt, block, sf_mode, col_major, flavor))} shape={shape} target={target} "
                     f"schedule={schedule}")
            assert_bitwise_equal(data, ref_data, f"data [{label}]")
            assert_bitwise_equal(sf, ref_sf, f"sf [{label}]")


@pytest.mark.parametrize("case", COVERING, ids=case_id)
def test_matches_reference(case):
    _check_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_matches_reference_full(case):
    _check_case(*case)


@pytest.mark.parametrize("case", SIM_COVERING, ids=case_id)
def test_matches_reference_on_ascend_sim(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_COVERING.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL, ids=case_id)
def test_matches_reference_on_ascend_sim_full(case):
    _check_case(*case, SIM_SHAPES, target="ascend-sim", offset=SIM_FULL.index(case))


@pytest.mark.slow
def test_large_shape():
    _check_case("bf16", "e4m3", (128, 128), "packed", True, "cuda", shapes=[(4096, 7168)])


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_packed_padding_bytes_are_never_written(flavor):
    # K/bk = 5 exponents per row: int16 pairs leave 1 unused byte, int32 quads 3.
    x = randn((256, 640), 5, torch.float32)
    options = dict(round_sf=True, use_packed_ue8m0=True)
    ref_data, ref_sf = per_block_cast(x, "e4m3", (32, 128), flavor=flavor, **options)
    sentinel = torch.full_like(ref_sf, -0x5A5A5A5B if flavor == "cuda" else -0x5A5B)
    out_sf = sentinel.clone()
    per_block_cast(x, "e4m3", (32, 128), flavor=flavor, out=(torch.empty_like(ref_data), out_sf), **options)
    got, want, fill = (t.view(torch.uint8).view(ref_sf.shape[0], -1) for t in (out_sf, ref_sf, sentinel))
    used = 640 // 128
    assert used < got.shape[1], "the case must have unused bytes"
    assert torch.equal(got[:, :used], want[:, :used])
    assert torch.equal(got[:, used:], fill[:, used:]), "unused bytes of packed words were written"
    assert torch.count_nonzero(want[:, used:]) == 0, "the allocated SF must zero unused bytes"


@pytest.mark.parametrize("case", [COVERING[0], COVERING[6]], ids=case_id)
def test_sf_only(case):
    in_dtype, fmt, block, sf_mode, col_major, flavor = case
    options = sf_options(sf_mode, col_major)
    for seed, shape in enumerate(SHAPES):
        x = _inputs(shape, DTYPES[in_dtype], seed + 40, block[1])
        sf = per_block_cast_with_sf_only(x, fmt, block, flavor=flavor, **options)
        assert_bitwise_equal(sf, reference.cast(x, fmt, block, flavor=flavor, **options)[1], f"sf-only {shape}")


@pytest.mark.parametrize("in_dtype,fmt,block,sf_mode", [("bf16", "e2m1", (32, 128), "pow2"),
                                                        ("fp32", "e4m3", (128, 32), "fp32")])
def test_precomputed_sf(in_dtype, fmt, block, sf_mode):
    options = sf_options(sf_mode, False)
    for seed, shape in enumerate(SHAPES):
        x = _inputs(shape, DTYPES[in_dtype], seed + 50, block[1])
        data, sf = per_block_cast(x, fmt, block, **options)
        cast_only = per_block_cast_with_precomputed_sf(x, fmt, block, sf, **options)
        assert_bitwise_equal(cast_only, reference.cast(x, fmt, block, sf=sf), f"precomputed-sf data {shape}")
        if sf_mode == "pow2":
            assert_bitwise_equal(cast_only, data, f"a power-of-two sf reproduces the cast {shape}")


@pytest.mark.slow
def test_sf_only_and_precomputed_sf_on_ascend_sim():
    # sf-only with packed row-major SF (rows of 1, 5, 12 and 3 exponents in int16 pairs, written
    # byte by byte); the cast with a precomputed power-of-two SF from the reference.
    packed, pow2 = sf_options("packed", False), sf_options("pow2", False)
    for seed, shape in enumerate(SIM_SHAPES):
        x = _inputs(shape, torch.float32, seed + 40, 128)
        with sim_schedule(_schedule(seed, 0)):
            sf = per_block_cast_with_sf_only(x, "e4m3", (32, 128), target="ascend-sim", **packed)
        label = f"shape={shape} schedule={_schedule(seed, 0)}"
        assert_bitwise_equal(sf, reference.cast(x, "e4m3", (32, 128), **packed)[1], f"sf-only {label}")
        x = _inputs(shape, torch.bfloat16, seed + 50, 128)
        ref_sf = reference.cast(x, "e2m1", (32, 128), **pow2)[1]
        with sim_schedule(_schedule(seed, 1)):
            data = per_block_cast_with_precomputed_sf(x, "e2m1", (32, 128), ref_sf, target="ascend-sim", **pow2)
        label = f"shape={shape} schedule={_schedule(seed, 1)}"
        assert_bitwise_equal(data, reference.cast(x, "e2m1", (32, 128), sf=ref_sf), f"precomputed-sf data {label}")


@pytest.mark.parametrize("target", [None, pytest.param("ascend-sim", marks=pytest.mark.slow)],
                         ids=["default", "ascend-sim"])
def test_noncontiguous_rows_and_out_tensors(target):
    base = randn((256, 768), 3, torch.bfloat16)
    x = base[:, :384]
    assert not x.is_contiguous()
    data, sf = per_block_cast(x, "e4m3", (32, 32), target=target)
    cont_data, cont_sf = per_block_cast(x.contiguous(), "e4m3", (32, 32), target=target)
    assert_bitwise_equal(data, cont_data, "data")
    assert_bitwise_equal(sf, cont_sf, "sf")
    ref_data, ref_sf = reference.cast(x, "e4m3", (32, 32))
    assert_bitwise_equal(cont_data, ref_data, "data vs reference")
    assert_bitwise_equal(cont_sf, ref_sf, "sf vs reference")
    # Preallocated outputs, the data with a padded row stride.
    out_base = torch.zeros((256, 512), dtype=torch.float8_e4m3fn)
    out_data = out_base[:, :384]
    out_sf = torch.zeros_like(cont_sf)
    with sim_schedule("consumers_first"):
        ret_data, ret_sf = per_block_cast(x, "e4m3", (32, 32), out=(out_data, out_sf), target=target)
    assert ret_data.data_ptr() == out_data.data_ptr() and ret_sf.data_ptr() == out_sf.data_ptr()
    assert_bitwise_equal(out_data.contiguous(), cont_data, "out data")
    assert_bitwise_equal(out_sf, cont_sf, "out sf")
    assert torch.count_nonzero(out_base[:, 384:].view(torch.uint8)) == 0, "wrote past the data columns"


def test_torch_target_and_parallel_entry_point():
    x = randn((128, 256), 19, torch.float32)
    options = dict(round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True)
    ref_data, ref_sf = reference.cast(x, "e2m1", (32, 32), **options)
    for got, want in zip(per_block_cast(x, "e2m1", (32, 32), target="torch", **options), (ref_data, ref_sf),
                         strict=True):
        assert_bitwise_equal(got, want, "torch target")
    for got, want in zip(per_block_cast_parallel(x, "e2m1", (32, 32), **options), (ref_data, ref_sf), strict=True):
        assert_bitwise_equal(got, want, "parallel entry point")
    with pytest.raises(ValueError, match="target 'torch'"):
        per_block_cast_parallel(x, "e4m3", (32, 32), target="torch")
