"""per_channel_cast on the cpu and ascend-sim targets, bit for bit against the torch reference
``reference.cast(x, "e4m3", (npt, 1), x_block_size=(1, npc), ...)`` (spec quant-b §1).

Each option combination is one compiled kernel (token count, hidden size and row strides are
runtime values); the default matrix is a covering set, the full product runs under ``slow``.
ascend-sim (the AscendC the ``ascend`` target emits, on vmi-core's model of the vector core)
runs a covering subset of the ascend-flavor cases, each shape under another pipe schedule, and
all of them under ``slow``. Data and SF are compared with dtype, shape and strides.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import (
    SIM_SCHEDULES,
    assert_bitwise_equal,
    generator,
    randn,
    randn_with_ties,
    sim_schedule,
    with_extremes,
    with_zero_groups,
)
from vmi_devkit.cases.pcc_cases import COVERING, FULL, IN_SF, SIM_COVERING, SIM_FULL, case_id, out_options
from vmi_devkit.errors import forbid_kernels
from vmi_quant import reference
from vmi_quant.ops.per_channel_cast import per_channel_cast, per_channel_cast_parallel

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# (tokens, hidden): empty; one 128-token tile; 3 tiles of tokens (npt 128: 3 blocks, so packed
# words end in an unused byte); 2 of 3; hidden 128, 384, 768.
SHAPES = [(0, 384), (128, 768), (384, 128), (256, 384)]
# ascend-sim (64 cores, npt x 128 work tiles, 2 buffer versions): with npt 32 / 128, 8 / 2 tiles
# (most cores idle), 24 / 6, and twice 516 / 129 tiles (every core / core 0 runs 3 or more: more
# than its buffer versions), the last two under consecutive pipe schedules (consumers_first and
# producers_first for the default run's case), so a missing wait between pipes shows up.
SIM_SHAPES = [(128, 128), (384, 256), (384, 5504), (384, 5504)]


def _schedule(seed, offset):
    """The ascend-sim pipe schedule of a case's ``seed``-th shape (``offset``: the case's index)."""
    return SIM_SCHEDULES[(seed + offset) % len(SIM_SCHEDULES)]


def _values(shape, seed, npt):
    """fp32 test values: ties, a per-channel dynamic range of 2^±24, zero blocks along the tokens
    (a channel's ``npt`` tokens all zero) and a few huge and tiny values."""
    x = randn_with_ties(shape, seed, torch.float32)
    if not shape[0]:
        return x
    exponents = torch.randint(-24, 25, (1, shape[1]), generator=generator(seed)).float()
    x = x * torch.exp2(exponents)
    x = with_zero_groups(x.T.contiguous(), npt, seed).T.contiguous()
    return with_extremes(x, seed)


def _free_leading_stride(sf: torch.Tensor, seed: int) -> torch.Tensor:
    """``sf`` copied into storage whose leading stride (the row stride of a row-major SF, the
    column stride of a column-major one) is enlarged by up to 2x (spec §1.5)."""
    if not sf.numel():
        return sf
    col_major = sf.stride(0) == 1 and sf.stride(1) != 1
    view = sf.T if col_major else sf
    rows, cols = view.shape
    lead = cols + int(torch.randint(0, cols + 1, (1,), generator=generator(seed)))
    # All-ones bytes (NaN, -1) in the gaps: a read of them shows up.
    storage = torch.full((rows, lead * sf.element_size()), -1, dtype=torch.int8).view(sf.dtype)
    storage[:, :cols] = view
    return storage[:, :cols].T if col_major else storage[:, :cols]


def _input(case, shape, seed):
    in_dtype, npc, in_sf, npt, _, flavor = case
    values = _values(shape, seed, npt)
    if in_dtype != "e4m3":
        return values.to(DTYPES[in_dtype])
    data, sf = reference.cast(values, "e4m3", (1, npc), flavor=flavor, **IN_SF[in_sf])
    return data, _free_leading_stride(sf, seed)


def _check_case(case, shapes=SHAPES, *, target=None, offset=0):
    in_dtype, npc, in_sf, npt, out_sf, flavor = case
    options = out_options(out_sf)
    x_block = None if npc is None else (1, npc)
    for seed, shape in enumerate(shapes):
        x = _input(case, shape, seed)
        with sim_schedule(_schedule(seed, offset)):
            data, sf = per_channel_cast(x, "e4m3", npt, num_per_channels=npc, target=target,
                                        flavor=None if target == "ascend-sim" else flavor, **options)
        ref_data, ref_sf = reference.cast(x, "e4m3", (npt, 1), x_block_size=x_block, flavor=flavor, **options)
        label = f"{case_id(case)} shape={shape} target={target} schedule={_schedule(seed, offset)}"
        assert_bitwise_equal(data, ref_data, f"data [{label}]")
        assert_bitwise_equal(sf, ref_sf, f"sf [{label}]")


@pytest.mark.parametrize("case", COVERING, ids=case_id)
def test_matches_reference(case):
    _check_case(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", FULL, ids=case_id)
def test_matches_reference_full(case):
    _check_case(case)


@pytest.mark.parametrize("case", SIM_COVERING, ids=case_id)
def test_matches_reference_on_ascend_sim(case):
    _check_case(case, SIM_SHAPES, target="ascend-sim", offset=SIM_COVERING.index(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", SIM_FULL, ids=case_id)
def test_matches_reference_on_ascend_sim_full(case):
    _check_case(case, SIM_SHAPES, target="ascend-sim", offset=SIM_FULL.index(case))


@pytest.mark.slow
def test_large_shape():
    _check_case(COVERING[4], shapes=[(8064, 7168)])


def test_output_layouts():
    # Ascend int16 words of 2 token blocks, e.g. T = 256, npt 32: 8 blocks -> (4, H), word [r, c] =
    # E(2r, c) | E(2r + 1, c) << 8 (spec §1.1); cuda int32 words of 4. The kernels of COVERING[2]
    # and [3] against the power-of-two fp32 SF (T / npt, H) of the reference.
    x = randn((512, 128), 4, torch.float32)
    for npt, flavor, dtype, pack in ((128, "ascend", torch.int16, 2), (32, "cuda", torch.int32, 4)):
        data, words = per_channel_cast(x, "e4m3", npt, round_sf=True, use_packed_ue8m0=True, flavor=flavor)
        want_data, sf = per_channel_cast(x, "e4m3", npt, round_sf=True, target="torch")
        assert data.dtype == torch.float8_e4m3fn and data.shape == (512, 128) and data.is_contiguous()
        assert sf.dtype == torch.float32 and sf.shape == (512 // npt, 128)
        assert words.dtype == dtype and words.shape == (512 // npt // pack, 128) and words.is_contiguous()
        exponents = (sf.view(torch.int32) >> 23).to(torch.int64)
        expected = sum(exponents[j::pack] << (8 * j) for j in range(pack))
        assert torch.equal(words.to(torch.int64) & (1 << 8 * pack) - 1, expected), flavor
        assert_bitwise_equal(data, want_data, f"data {flavor}")


def test_requantization_order():
    # (data * s_in) * sf_inv (spec §1.2) in the cuda flavor too, whose per_token_cast multiplies
    # data * (s_in * sf_inv): the reference of the dequantized fp32 values, with an input SF of 1/3
    # (inexact, so the order matters). The kernel of COVERING[5].
    values = randn((256, 256), 6) * 3
    data, sf_in = reference.cast(values, "e4m3", (1, 128))
    sf_in = torch.full_like(sf_in, 1 / 3)
    got, got_sf = per_channel_cast((data, sf_in), "e4m3", 128, num_per_channels=128, flavor="cuda")
    want, want_sf = reference.cast(data.float() * sf_in[0, 0], "e4m3", (128, 1), flavor="cuda")
    assert_bitwise_equal(got, want, "data")
    assert_bitwise_equal(got_sf, want_sf, "sf")


@pytest.mark.parametrize("target", [None, "ascend-sim"], ids=["default", "ascend-sim"])
def test_strided_rows(target):
    # Unit stride along the channels, a padded row stride: the kernel of COVERING[1].
    base = randn((384, 640), 3, torch.bfloat16)
    x = base[:, :256]
    assert not x.is_contiguous()
    with sim_schedule("consumers_first"):
        got = per_channel_cast(x, "e4m3", 128, round_sf=True, target=target)
    want = reference.cast(x.contiguous(), "e4m3", (128, 1), round_sf=True)
    for name, a, b in zip(("data", "sf"), got, want, strict=True):
        assert_bitwise_equal(a, b, name)


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="T == 0")
    data, sf = per_channel_cast(torch.empty(0, 256, dtype=torch.bfloat16), "e4m3", 32, round_sf=True,
                                use_packed_ue8m0=True, flavor="cuda")
    assert data.shape == (0, 256) and data.dtype == torch.float8_e4m3fn
    assert sf.shape == (0, 256) and sf.dtype == torch.int32
    quantized = reference.cast(torch.empty(0, 256), "e4m3", (1, 128))
    data, sf = per_channel_cast(quantized, "e4m3", 128, num_per_channels=128)
    assert data.shape == (0, 256) and sf.shape == (0, 256) and sf.dtype == torch.float32


def test_torch_target_and_parallel_entry_point():
    x = randn((256, 128), 19, torch.float32)
    options = dict(round_sf=True, use_packed_ue8m0=True)
    ref_data, ref_sf = reference.cast(x, "e4m3", (128, 1), **options)
    for got, want in zip(per_channel_cast(x, "e4m3", 128, target="torch", **options), (ref_data, ref_sf),
                         strict=True):
        assert_bitwise_equal(got, want, "torch target")
    for got, want in zip(per_channel_cast_parallel(x, "e4m3", 128, **options), (ref_data, ref_sf), strict=True):
        assert_bitwise_equal(got, want, "parallel entry point")
    with pytest.raises(ValueError, match="target 'torch'"):
        per_channel_cast_parallel(x, "e4m3", 128, target="torch")
