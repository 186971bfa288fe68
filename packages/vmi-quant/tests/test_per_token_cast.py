"""per_token_cast on the cpu and ascend-sim targets, bit for bit against the torch reference.

Each option combination is one compiled kernel (token count, hidden size and
strides are runtime values), so the default matrix is a covering set in which every
option value meets every other relevant one at least once; the full product runs
under the ``slow`` marker. ascend-sim (the AscendC the ``ascend`` target emits, on
vmi-core's model of the vector core) runs a covering subset of the ascend-flavor cases,
each shape under another pipe schedule (the 258-tile one under both consumers_first and
producers_first), and all of them under ``slow``.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.formats import e2m1_decode, e2m1_unpack, e4m3_decode
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
from vmi_devkit.cases.ptc_cases import COVERING, DTYPES, FULL, SHAPES, SIM_COVERING, SIM_FULL, SIM_SHAPES, sf_options
from vmi_quant import (
    per_token_cast,
    per_token_cast_parallel,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
    reference,
    reset_runtime_config,
    set_amax_clamp_for_quant,
)


def _reference(x, fmt, npc, flavor, x_block_size=None, stochastic_cast=False, **options):
    return reference.cast(x, fmt, (1, npc), x_block_size=x_block_size, stochastic=stochastic_cast,
                          flavor=flavor, **options)


def _inputs(shape, dtype, seed, group):
    x = randn_with_ties(shape, seed, torch.float32)
    if shape[0] and shape[1]:
        x = with_extremes(with_zero_groups(x, group, seed), seed)
    return x.to(dtype)


# The shape of SIM_SHAPES with 258 tiles: only there do cores reuse a buffer version, so it runs
# under both schedules that expose a missing wait (consumers first: read-after-write; producers
# first: write-after-read).
SIM_WIDE_SHAPE = (4100, 192)


def _schedule(seed, offset):
    """The ascend-sim pipe schedule of a case's ``seed``-th shape (``offset``: the case's index)."""
    return SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]


def _check_case(in_dtype, fmt, npc, sf_mode, col_major, flavor, shapes=SHAPES, *, target=None, offset=0,
                stochastic_cast=False):
    options = sf_options(sf_mode, col_major)
    for seed, (m, k) in enumerate(shapes):
        x = _inputs((m, k), DTYPES[in_dtype], seed, npc)
        ref_data, ref_sf = _reference(x, fmt, npc, flavor, stochastic_cast=stochastic_cast, **options)
        wide = target == "ascend-sim" and (m, k) == SIM_WIDE_SHAPE
        for schedule in REUSE_SCHEDULES if wide else [_schedule(seed, offset)]:
            with sim_schedule(schedule):
                data, sf = per_token_cast(x, fmt, npc, stochastic_cast=stochastic_cast, flavor=flavor,
                                          target=target, **options)
            label = (f"{in_dtype}->{fmt} npc={npc} sf={sf_mode} col={col_major} sr={stochastic_cast} {flavor} "
                     f"shape={(m, k)} target={target} schedule={schedule}")
            assert_bitwise_equal(data, ref_data, f"data [{label}]")
            assert_bitwise_equal(sf, ref_sf, f"sf [{label}]")


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
    _check_case("bf16", "e4m3", 32, "fp32", False, "ascend", shapes=[(4096, 7168)])
    _check_case("bf16", "e2m1", 32, "packed", True, "ascend", shapes=[(4096, 7168)])


@pytest.mark.parametrize("target", [None, "ascend-sim"], ids=["default", "ascend-sim"])
def test_noncontiguous_rows_and_out_tensors(target):
    base = randn((40, 768), 3, torch.bfloat16)
    x = base[:, :384]
    assert not x.is_contiguous()
    data, sf = per_token_cast(x, "e4m3", 32, target=target)
    cont_data, cont_sf = per_token_cast(x.contiguous(), "e4m3", 32, target=target)
    assert_bitwise_equal(data, cont_data, "data")
    assert_bitwise_equal(sf, cont_sf, "sf")
    ref_data, ref_sf = _reference(x, "e4m3", 32, "ascend")
    assert_bitwise_equal(cont_data, ref_data, "data vs reference")
    assert_bitwise_equal(cont_sf, ref_sf, "sf vs reference")
    # Preallocated outputs, the data with a padded row stride.
    out_base = torch.zeros((40, 512), dtype=torch.float8_e4m3fn)
    out_data = out_base[:, :384]
    out_sf = torch.zeros_like(cont_sf)
    with sim_schedule("consumers_first"):
        ret_data, ret_sf = per_token_cast(x, "e4m3", 32, out=(out_data, out_sf), target=target)
    assert ret_data.data_ptr() == out_data.data_ptr() and ret_sf.data_ptr() == out_sf.data_ptr()
    assert_bitwise_equal(out_data.contiguous(), cont_data, "out data")
    assert_bitwise_equal(out_sf, cont_sf, "out sf")
    assert torch.count_nonzero(out_base[:, 384:].view(torch.uint8)) == 0, "wrote past the data columns"


@pytest.mark.parametrize("flavor", ["ascend", "cuda"])
def test_packed_padding_bytes_are_never_written(flavor):
    # Rows of 10 exponents (int32 words: 2 unused bytes per row) or 5 (int16 pairs: 1 unused).
    npc = 64 if flavor == "ascend" else 32
    hidden = 320
    x = randn((45, hidden), 5, torch.bfloat16)
    ref_data, ref_sf = per_token_cast(x, "e2m1", npc, round_sf=True, use_packed_ue8m0=True, flavor=flavor)
    sentinel = torch.full_like(ref_sf, -0x5A5A5A5B if flavor == "cuda" else -0x5A5B)
    out_sf = sentinel.clone()
    per_token_cast(x, "e2m1", npc, round_sf=True, use_packed_ue8m0=True, flavor=flavor,
                   out=(torch.empty_like(ref_data), out_sf))
    got, want, fill = (t.view(torch.uint8).view(45, -1) for t in (out_sf, ref_sf, sentinel))
    used = -(-hidden // npc)
    assert used < got.shape[1], "the case must have unused bytes"
    assert torch.equal(got[:, :used], want[:, :used])
    assert torch.equal(got[:, used:], fill[:, used:]), "unused bytes of packed words were written"
    assert torch.count_nonzero(want[:, used:]) == 0, "the allocated SF must zero unused bytes"


QUANT_INPUTS = [
    # (in_fmt, x_block_size, in_sf_mode, in_col_major, fmt, num_per_channels, flavor)
    ("e4m3", (32, 32), "fp32", False, "e4m3", 32, "ascend"),
    ("e4m3", (32, 32), "fp32", False, "e4m3", 32, "cuda"),
    ("e2m1", (32, 32), "packed", True, "e4m3", 64, "ascend"),
    ("e2m1", (1, 32), "packed", False, "e2m1", 16, "cuda"),
    ("e4m3", (128, 128), "e4m3", True, "e2m1", 128, "cuda"),
    ("e2m1", (32, 1), "packed", False, "e4m3", 32, "ascend"),
]


# ascend-sim: by default the input block with the most input scales per tile (32 x 1, packed
# along tokens), the other ascend-flavor inputs under slow.
SIM_QUANT_INPUTS = [QUANT_INPUTS[5]]
SIM_QUANT_INPUTS_FULL = [case for case in QUANT_INPUTS if case[-1] == "ascend" and case not in SIM_QUANT_INPUTS]
SIM_QUANT_SHAPES = [(1, 64), (70, 384), (4100, 192), (130, 192)]


def _check_quantized_input(case, shapes, target=None):
    in_fmt, x_block, in_sf_mode, in_col, fmt, npc, flavor = case
    offset = QUANT_INPUTS.index(case)
    for seed, (m, k) in enumerate(shapes):
        x = randn((m, k), seed, torch.bfloat16)
        qx = reference.cast(x, in_fmt, x_block, flavor=flavor, **sf_options(in_sf_mode, in_col))
        with sim_schedule(_schedule(seed, offset)):
            data, sf = per_token_cast(qx, fmt, npc, x_block_size=x_block, flavor=flavor, target=target)
        ref_data, ref_sf = _reference(qx, fmt, npc, flavor, x_block_size=x_block)
        label = f"{case} {(m, k)} target={target} schedule={_schedule(seed, offset)}"
        assert_bitwise_equal(data, ref_data, f"data {label}")
        assert_bitwise_equal(sf, ref_sf, f"sf {label}")


@pytest.mark.parametrize("case", QUANT_INPUTS, ids=lambda c: "-".join(map(str, c)))
def test_quantized_input(case):
    _check_quantized_input(case, [(1, 64), (70, 384), (130, 192)])


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_QUANT_INPUTS, ids=lambda c: "-".join(map(str, c)))
def test_quantized_input_on_ascend_sim(case):
    # Input-SF blocks read across tile and token tails, and on cores that run 4 or 5 tiles.
    _check_quantized_input(case, SIM_QUANT_SHAPES, target="ascend-sim")


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_QUANT_INPUTS_FULL, ids=lambda c: "-".join(map(str, c)))
def test_quantized_input_on_ascend_sim_full(case):
    _check_quantized_input(case, SIM_QUANT_SHAPES, target="ascend-sim")


@pytest.mark.parametrize("in_dtype,fmt,sf_mode", [("bf16", "e4m3", "fp32"), ("fp32", "e2m1", "pow2")])
def test_sf_only_and_precomputed_sf(in_dtype, fmt, sf_mode):
    x = _inputs((70, 384), DTYPES[in_dtype], 11, 32)
    options = sf_options(sf_mode, False)
    data, sf = per_token_cast(x, fmt, 32, **options)
    assert_bitwise_equal(per_token_cast_with_sf_only(x, fmt, 32, **options), sf, "sf-only")
    cast_only = per_token_cast_with_precomputed_sf(x, fmt, 32, sf, **options)
    assert_bitwise_equal(cast_only, reference.cast(x, fmt, (1, 32), sf=sf), "precomputed-sf data")
    if sf_mode == "pow2":
        assert_bitwise_equal(cast_only, data, "precomputed power-of-two sf reproduces the cast")


def test_round_sf_does_not_specialise_the_precomputed_sf_kernel():
    # The given SF is only read: one kernel for both values (no second compile).
    from vmi_quant.ops.per_token_cast import PerTokenCastOptions, SFOptions, _prepare

    x = _inputs((4, 64), torch.float32, 3, 32)
    _, sf = reference.cast(x, "e4m3", (1, 32))
    specs = {_prepare(PerTokenCastOptions("e4m3", 32, sf=SFOptions(round_sf=round_sf), mode="cast_only"), x, None,
                      sf, "cpu", None)[1].spec for round_sf in (False, True)}
    assert len(specs) == 1


@pytest.mark.slow
def test_sf_only_and_precomputed_sf_on_ascend_sim():
    # sf-only with packed row-major SF (int16 pairs written byte by byte), the cast with a
    # precomputed E4M3 SF; 16 channels a group. The SF comes from the reference.
    packed, e4m3_sf = sf_options("packed", False), sf_options("e4m3", False)
    for seed, (m, k) in enumerate(SIM_SHAPES):
        x = _inputs((m, k), torch.bfloat16, seed + 60, 16)
        with sim_schedule(_schedule(seed, 0)):
            sf = per_token_cast_with_sf_only(x, "e2m1", 16, target="ascend-sim", **packed)
        label = f"shape={(m, k)} schedule={_schedule(seed, 0)}"
        assert_bitwise_equal(sf, _reference(x, "e2m1", 16, "ascend", **packed)[1], f"sf-only {label}")
        ref_sf = _reference(x, "e2m1", 16, "ascend", **e4m3_sf)[1]
        with sim_schedule(_schedule(seed, 1)):
            data = per_token_cast_with_precomputed_sf(x, "e2m1", 16, ref_sf, target="ascend-sim", **e4m3_sf)
        label = f"shape={(m, k)} schedule={_schedule(seed, 1)}"
        assert_bitwise_equal(data, reference.cast(x, "e2m1", (1, 16), sf=ref_sf), f"precomputed-sf data {label}")


def test_precomputed_e4m3_sf():
    x = _inputs((33, 256), torch.float32, 12, 16)
    data, sf = per_token_cast(x, "e2m1", 16, use_e4m3_sf=True)
    cast_only = per_token_cast_with_precomputed_sf(x, "e2m1", 16, sf, use_e4m3_sf=True)
    assert_bitwise_equal(cast_only, reference.cast(x, "e2m1", (1, 16), sf=sf), "data")


def test_amax_clamp_is_part_of_the_kernel():
    x = randn((32, 128), 13, torch.bfloat16)
    default_sf = per_token_cast(x, "e4m3", 32)[1]
    try:
        set_amax_clamp_for_quant("e4m3", False, 1e6)
        data, sf = per_token_cast(x, "e4m3", 32)
        ref_data, ref_sf = _reference(x, "e4m3", 32, "ascend")
        assert_bitwise_equal(data, ref_data, "data")
        assert_bitwise_equal(sf, ref_sf, "sf")
        assert bool((sf >= 0.99 * 1e6 / 448).all()) and bool((sf > default_sf).all())
    finally:
        reset_runtime_config()


@pytest.mark.slow
def test_stochastic_cast_on_ascend_sim():
    _check_case("bf16", "e4m3", 32, "fp32", False, "ascend", SIM_SHAPES, target="ascend-sim", offset=1,
                stochastic_cast=True)


def _dequant(data, sf, fmt, npc):
    codes = e2m1_decode(e2m1_unpack(data)) if fmt == "e2m1" else e4m3_decode(data.view(torch.uint8))
    return codes * sf.float().repeat_interleave(npc, dim=1)[:, :codes.shape[1]]


def _rank(data, fmt):
    """Monotone index of representable levels (adjacent levels differ by one)."""
    if fmt == "e2m1":
        codes = e2m1_unpack(data).long()
        return torch.where(codes & 8 != 0, 7 - (codes & 7), 7 + (codes & 7))
    codes = data.view(torch.uint8).long()
    return torch.where(codes & 0x80 != 0, 0x7E - (codes & 0x7F), 0x7E + (codes & 0x7F))


@pytest.mark.parametrize("fmt,in_dtype,npc", [("e4m3", "bf16", 32), ("e2m1", "fp32", 16)])
def test_stochastic_cast(fmt, in_dtype, npc):
    x = randn((512, 1024), 17, DTYPES[in_dtype])
    sr_data, sr_sf = per_token_cast(x, fmt, npc, stochastic_cast=True)
    again = per_token_cast(x, fmt, npc, stochastic_cast=True)
    assert_bitwise_equal(again[0], sr_data, "SR is deterministic")
    ref_data, ref_sf = _reference(x, fmt, npc, "ascend", stochastic_cast=True)
    assert_bitwise_equal(sr_data, ref_data, "SR data vs reference")
    rne_data, rne_sf = per_token_cast(x, fmt, npc)
    assert_bitwise_equal(sr_sf, rne_sf, "SR leaves the SF unchanged")
    assert not torch.equal(sr_data.view(torch.uint8), rne_data.view(torch.uint8)), "SR equals RNE"
    assert int((_rank(sr_data, fmt) - _rank(rne_data, fmt)).abs().max()) <= 1, "SR moved more than one level"
    # Unbiased: the dequantized SR error averages out; RNE's stays. Bound: 10 standard errors
    # of a mean of n errors each within one quantization step of the group scale.
    xf = x.float()
    error = _dequant(sr_data, sr_sf, fmt, npc) - xf
    step = 2.0 ** -3 if fmt == "e4m3" else 2.0 ** -1
    bound = 10 * step * xf.abs().mean() / xf.numel() ** 0.5
    assert abs(float(error.mean())) < bound
    below = (_dequant(sr_data, sr_sf, fmt, npc) < xf).float().mean() + \
        0.5 * (_dequant(sr_data, sr_sf, fmt, npc) == xf).float().mean()
    assert abs(float(below) - 0.5) < 10 / xf.numel() ** 0.5


def test_torch_target_runs_the_reference():
    x = randn((20, 256), 19, torch.bfloat16)
    data, sf = per_token_cast(x, "e2m1", 32, round_sf=True, use_packed_ue8m0=True, target="torch")
    ref_data, ref_sf = _reference(x, "e2m1", 32, "ascend", round_sf=True, use_packed_ue8m0=True)
    assert_bitwise_equal(data, ref_data, "data")
    assert_bitwise_equal(sf, ref_sf, "sf")
    with pytest.raises(ValueError, match="target 'torch'"):
        per_token_cast_parallel(x, "e4m3", 32, target="torch")


def test_parallel_entry_point_matches_dispatch():
    x = randn((20, 256), 23, torch.float32)
    for got, want in zip(per_token_cast_parallel(x, "e4m3", 64), per_token_cast(x, "e4m3", 64), strict=True):
        assert_bitwise_equal(got, want)


def test_flavor_env_default(vmi_env):
    x = randn((8, 128), 29, torch.bfloat16)
    vmi_env.setenv("VMI_FLAVOR", "cuda")
    _, sf = per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True)
    assert sf.dtype == torch.int32 and sf.shape == (8, 1)
    vmi_env.setenv("VMI_FLAVOR", "ascend")
    _, sf = per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True)
    assert sf.dtype == torch.int16 and sf.shape == (8, 2)
