"""per_token_cast on the cpu target, bit for bit against the torch reference.

Each option combination is one compiled kernel (token count, hidden size and
strides are runtime values), so the default matrix is a covering set in which every
option value meets every other relevant one at least once; the full product runs
under the ``slow`` marker.
"""

from __future__ import annotations

import pytest
import torch
from ptc_cases import COVERING, DTYPES, FULL, SHAPES, sf_options

from vmi_core.formats import e2m1_decode, e2m1_unpack, e4m3_decode
from vmi_core.testing import assert_bitwise_equal, randn, randn_with_ties, with_extremes, with_zero_groups
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


def _check_case(in_dtype, fmt, npc, sf_mode, col_major, flavor, shapes=SHAPES):
    options = sf_options(sf_mode, col_major)
    for seed, (m, k) in enumerate(shapes):
        x = _inputs((m, k), DTYPES[in_dtype], seed, npc)
        data, sf = per_token_cast(x, fmt, npc, flavor=flavor, **options)
        ref_data, ref_sf = _reference(x, fmt, npc, flavor, **options)
        label = f"{in_dtype}->{fmt} npc={npc} sf={sf_mode} col={col_major} {flavor} shape={(m, k)}"
        assert_bitwise_equal(data, ref_data, f"data [{label}]")
        assert_bitwise_equal(sf, ref_sf, f"sf [{label}]")


@pytest.mark.parametrize("case", COVERING, ids=lambda c: "-".join(map(str, c)))
def test_matches_reference(case):
    _check_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=lambda c: "-".join(map(str, c)))
def test_matches_reference_full(case):
    _check_case(*case)


@pytest.mark.slow
def test_large_shape():
    _check_case("bf16", "e4m3", 32, "fp32", False, "ascend", shapes=[(4096, 7168)])
    _check_case("bf16", "e2m1", 32, "packed", True, "ascend", shapes=[(4096, 7168)])


def test_noncontiguous_rows_and_out_tensors():
    base = randn((40, 768), 3, torch.bfloat16)
    x = base[:, :384]
    assert not x.is_contiguous()
    data, sf = per_token_cast(x, "e4m3", 32)
    cont_data, cont_sf = per_token_cast(x.contiguous(), "e4m3", 32)
    assert_bitwise_equal(data, cont_data, "data")
    assert_bitwise_equal(sf, cont_sf, "sf")
    # Preallocated outputs, the data with a padded row stride.
    out_base = torch.zeros((40, 512), dtype=torch.float8_e4m3fn)
    out_data = out_base[:, :384]
    out_sf = torch.zeros_like(cont_sf)
    ret_data, ret_sf = per_token_cast(x, "e4m3", 32, out=(out_data, out_sf))
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


@pytest.mark.parametrize("case", QUANT_INPUTS, ids=lambda c: "-".join(map(str, c)))
def test_quantized_input(case):
    in_fmt, x_block, in_sf_mode, in_col, fmt, npc, flavor = case
    for seed, (m, k) in enumerate([(1, 64), (70, 384), (130, 192)]):
        x = randn((m, k), seed, torch.bfloat16)
        qx = reference.cast(x, in_fmt, x_block, flavor=flavor, **sf_options(in_sf_mode, in_col))
        data, sf = per_token_cast(qx, fmt, npc, x_block_size=x_block, flavor=flavor)
        ref_data, ref_sf = _reference(qx, fmt, npc, flavor, x_block_size=x_block)
        assert_bitwise_equal(data, ref_data, f"data {case} {(m, k)}")
        assert_bitwise_equal(sf, ref_sf, f"sf {case} {(m, k)}")


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


def test_flavor_env_default(monkeypatch):
    x = randn((8, 128), 29, torch.bfloat16)
    monkeypatch.setenv("VMI_FLAVOR", "cuda")
    _, sf = per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True)
    assert sf.dtype == torch.int32 and sf.shape == (8, 1)
    monkeypatch.setenv("VMI_FLAVOR", "ascend")
    _, sf = per_token_cast(x, "e4m3", 32, round_sf=True, use_packed_ue8m0=True)
    assert sf.dtype == torch.int16 and sf.shape == (8, 2)
