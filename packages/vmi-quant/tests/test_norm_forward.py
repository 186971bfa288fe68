"""norm_forward and norm_forward_and_per_token_cast on the cpu and ascend-sim targets, bit for bit
against the torch reference (spec quant-b §4), and the reference against float64.

Every output is compared with dtype, shape and strides: ``out``/``rstd``/``residual_out`` (the
square sum has one fixed order, ``vmi_core.sums``, so rstd and the normalised output are exact
matches, not tolerances), the E4M3 data and SF in every layout, the bf16 side output and the
Mega MoE SF buffer including the rows no token maps to. Each case is one compiled kernel (the
hidden size, eps, out_scale, flavor and options are compile-time; token count and strides are
not), run on several shapes: no tokens, one, a partial tile, several thread ranges, 3-D with
padded row and batch strides. The reference itself is checked against a float64 evaluation
within the spec's tolerances.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.tools.testing import REUSE_SCHEDULES, SIM_SCHEDULES, assert_bitwise_equal, randn, sim_schedule
from vmi_devkit.cases.norm_forward_cases import CAST_CASES, EPS, NORM_CASES
from vmi_devkit.errors import forbid_kernels
from vmi_quant import reference
from vmi_quant.ops.norm_forward import (
    NORM_FORWARD,
    norm_forward,
    norm_forward_and_per_token_cast,
    norm_forward_and_per_token_cast_parallel,
    norm_forward_parallel,
)
from vmi_quant.reference.norm import mega_moe_rows, mega_moe_window

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# Under ``slow``: the largest hidden size with every output.
LARGE_CAST_CASE = ("fp32", 7168, True, True, 0.3, "cuda", True, True, True, True, 0)


def _case_id(case) -> str:
    return "-".join(str(v) for v in case)


def _x(shape, seed, dtype, row_pad=0, batch_pad=0):
    """Values with a dynamic range of 2^±8 per row, as a view with padded row (and batch) strides."""
    *lead, hidden = shape
    values = randn(shape, seed) * torch.exp2(torch.randint(-8, 9, (*lead, 1), generator=torch.Generator()
                                                           .manual_seed(seed)).float())
    values = values.to(DTYPES[dtype])
    if not row_pad and not batch_pad:
        return values
    if len(shape) == 2:
        storage = torch.full((shape[0], hidden + row_pad), float("nan"), dtype=values.dtype)
        view = storage[:, :hidden]
    else:
        storage = torch.full((shape[0], shape[1] + batch_pad, hidden + row_pad), float("nan"), dtype=values.dtype)
        view = storage[:, :shape[1], :hidden]
    view.copy_(values)
    return view


def _shapes(hidden):
    """(shape, row padding, batch padding): no tokens, one, a partial tile, several thread ranges,
    strided rows, 3-D with padded strides."""
    return [((0, hidden), 0, 0), ((1, hidden), 0, 0), ((37, hidden), 0, 0), ((70, hidden), 0, 0),
            ((19, hidden), 16, 0), ((2, 21, hidden), 16, 1)]


def _inputs(case, shape, seed, row_pad, batch_pad):
    dtype, hidden, has_weight, has_residual = case[:4]
    x = _x(shape, seed, dtype, row_pad, batch_pad)
    weight = randn((hidden,), seed + 1).to(DTYPES[dtype]) if has_weight else None
    residual = _x(shape, seed + 2, dtype, row_pad, 0) if has_residual else None
    return x, weight, residual


def _check_norm(case, target=None, shapes=None):
    dtype, hidden, _, _, out_scale, flavor = case
    for seed, (shape, row_pad, batch_pad) in enumerate(shapes or _shapes(hidden)):
        x, weight, residual = _inputs(case, shape, seed, row_pad, batch_pad)
        kernel_flavor = None if target == "ascend-sim" else flavor
        with sim_schedule(SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]):
            out, rstd, norm_input = norm_forward(x, weight, EPS, residual, out_scale, target=target,
                                                 flavor=kernel_flavor)
        want_out, want_rstd, want_input = reference.norm.norm_forward(x, weight, EPS, residual, out_scale, flavor)
        label = f"{_case_id(case)} shape={shape} target={target}"
        assert_bitwise_equal(out, want_out, f"out [{label}]", check_stride=False)
        assert out.is_contiguous()
        assert_bitwise_equal(rstd, want_rstd, f"rstd [{label}]")
        if residual is None:
            assert norm_input is x
        else:
            assert_bitwise_equal(norm_input, want_input, f"residual_out [{label}]", check_stride=False)


@pytest.mark.parametrize("case", NORM_CASES, ids=_case_id)
def test_norm_forward_matches_reference(case):
    _check_norm(case)


def _mega_buffer(tokens, hidden, block_m, seed):
    """An M-major int32 ``(T, H / 128)`` buffer with a padded column stride, filled with -1."""
    rows = -(-tokens // block_m) * (-(-block_m // 128) * 128) + seed % 3
    storage = torch.full(((hidden // 128) * rows,), -1, dtype=torch.int32)
    return storage.as_strided((tokens, hidden // 128), (1, rows))


def _clear_pad_bytes(sf: torch.Tensor, groups: int) -> torch.Tensor:
    """A copy of a packed SF with the bytes past ``groups`` in each row zeroed (unspecified, §0.4)."""
    if sf.dtype == torch.float32 or not sf.numel():
        return sf
    bytes_ = sf.contiguous().view(torch.uint8).clone()
    bytes_.view(*sf.shape[:-1], -1)[..., groups:] = 0
    return bytes_.view(sf.dtype).reshape(sf.shape)


def _check_cast(case, target=None, shapes=None, non_finite=False, schedules=None):
    """With ``non_finite``, rows 3, 5 and 6 of 2-D shapes hold a NaN, +inf and -inf (rstd NaN in the
    ascend flavor: every NaN must be the reference's canonical one). Each shape runs under
    ``schedules`` (one launch each against one reference), by default the next of ``SIM_SCHEDULES``."""
    dtype, hidden, _, _, out_scale, flavor, col_major, round_sf, packed, with_bf16, block_m = case
    for seed, (shape, row_pad, batch_pad) in enumerate(shapes or _shapes(hidden)):
        if block_m and len(shape) == 3:
            continue
        x, weight, residual = _inputs(case, shape, seed, row_pad, batch_pad)
        if non_finite and len(shape) == 2 and shape[0] > 6:
            x[3, 17], x[5, 150], x[6, 0] = float("nan"), float("inf"), -float("inf")
        options = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed,
                       with_out_bf16=with_bf16)
        want_mega = None if not block_m else _mega_buffer(shape[0], hidden, block_m, seed)
        (want_data, want_sf), want_bf16, want_rstd, want_input = norm_forward_and_per_token_cast(
            x, weight, EPS, "e4m3", 32, residual, out_scale, **options, mega_moe_sf=want_mega,
            mega_moe_block_m=block_m, target="torch", flavor=flavor)
        for schedule in schedules or [SIM_SCHEDULES[seed % len(SIM_SCHEDULES)]]:
            mega = _mega_buffer(shape[0], hidden, block_m, seed) if block_m else None
            with sim_schedule(schedule):
                (data, sf), out_bf16, rstd, norm_input = norm_forward_and_per_token_cast(
                    x, weight, EPS, "e4m3", 32, residual, out_scale, **options, mega_moe_sf=mega,
                    mega_moe_block_m=block_m, target=target, flavor=None if target == "ascend-sim" else flavor)
            label = f"{_case_id(case)} shape={shape} target={target} schedule={schedule}"
            assert_bitwise_equal(data, want_data, f"data [{label}]")
            assert_bitwise_equal(_clear_pad_bytes(sf, hidden // 32), _clear_pad_bytes(want_sf, hidden // 32),
                                 f"sf [{label}]", check_stride=False)
            assert sf.stride() == want_sf.stride(), label
            assert_bitwise_equal(rstd, want_rstd, f"rstd [{label}]")
            if with_bf16:
                assert_bitwise_equal(out_bf16, want_bf16, f"out_bf16 [{label}]")
            else:
                assert out_bf16 is None
            if residual is None:
                assert norm_input is x
            else:
                assert_bitwise_equal(norm_input, want_input, f"residual_out [{label}]")
            if mega is not None:
                assert_bitwise_equal(mega_moe_window(mega), mega_moe_window(want_mega), f"mega_moe_sf [{label}]")


@pytest.mark.parametrize("case", CAST_CASES, ids=_case_id)
def test_norm_forward_and_per_token_cast_matches_reference(case):
    _check_cast(case)


@pytest.mark.slow
def test_large_hidden_size():
    _check_cast(LARGE_CAST_CASE, shapes=[((300, 7168), 0, 0), ((2, 40, 7168), 64, 3)])


def test_cast_equals_per_token_cast_of_the_output():
    # §4.2 step 6: the quantized result is per_token_cast of norm_forward's output (the reference of
    # the per-token cast applied to the kernel's own normalised output, spec §4.6).
    case = CAST_CASES[0]
    x, weight, residual = _inputs(case, (64, 256), 5, 0, 0)
    (data, sf), out_bf16, _, _ = norm_forward_and_per_token_cast(x, weight, EPS, "e4m3", 32, residual, 0.3,
                                                                 True, True, True, True)
    out, _, _ = norm_forward(x, weight, EPS, residual, 0.3, target="torch")
    want_data, want_sf = reference.cast(out, "e4m3", (1, 32), round_sf=True, use_tma_aligned_col_major_sf=True,
                                        use_packed_ue8m0=True)
    assert_bitwise_equal(data, want_data, "data")
    assert_bitwise_equal(sf, want_sf, "sf")
    assert_bitwise_equal(out_bf16, out, "out_bf16")


def test_mega_moe_rows_and_untouched_rows():
    # §4.4, bm = 192: t=0->0, 1->4, 31->124, 32->1, 127->127, 128->128, 191->253, 192->256; rows 130,
    # 131, 134, 135 of the first run are never written and keep the sentinel. The kernel of CAST_CASES[2].
    rows = mega_moe_rows(200, 192)
    assert [int(rows[t]) for t in (0, 1, 31, 32, 127, 128, 191, 192)] == [0, 4, 124, 1, 127, 128, 253, 256]
    x = randn((200, 512), 7, torch.bfloat16)
    mega = _mega_buffer(200, 512, 192, 0)
    (_, sf), _, _, _ = norm_forward_and_per_token_cast(x, None, EPS, "e4m3", 32, use_tma_aligned_col_major_sf=True,
                                                       round_sf=True, mega_moe_sf=mega, mega_moe_block_m=192,
                                                       flavor="cuda")
    window = mega_moe_window(mega)
    written = torch.zeros(window.shape[0], dtype=torch.bool)
    written[rows] = True
    assert written[[130, 131, 134, 135]].sum() == 0
    assert (window[~written] == -1).all()
    exponents = (sf.view(torch.int32) >> 23) & 0xFF
    words = window[rows].view(torch.uint8).view(200, -1).to(torch.int32)
    assert torch.equal(words, exponents)


def test_reference_against_float64():
    # The reference (and so the kernel) against float64: rstd within rtol 2e-6 / atol 1e-7 (spec §3,
    # both flavors: the compensated rstd is nearly correctly rounded, the cuda form within 2.5 ulp,
    # plus the fp32 square sum's rounding), the output within the dtype's tolerance (bf16: one
    # rounding of y; fp32: a few ulp of y's products).
    for dtype, hidden in (("fp32", 7168), ("bf16", 4096), ("fp32", 200)):
        x = _x((16, hidden), 11, dtype)
        weight = randn((hidden,), 12).to(DTYPES[dtype])
        residual = _x((16, hidden), 13, dtype)
        y64, rstd64 = reference.norm.norm_forward_float64(x, weight, EPS, residual, 0.3)
        for flavor in ("ascend", "cuda"):
            out, rstd, _ = reference.norm.norm_forward(x, weight, EPS, residual, 0.3, flavor)
            torch.testing.assert_close(rstd.double(), rstd64, rtol=2e-6, atol=1e-7)
            rtol = 1.6e-2 if dtype == "bf16" else 1.3e-6
            torch.testing.assert_close(out.double(), y64, rtol=rtol, atol=1e-5)


def test_weight_operand_order():
    # §4.2: y = f32(f32(r * rstd) * w') with w' = f32(w * f32(out_scale)); w = 3, out_scale = 0.3:
    # w' = 0.9000000357..., and the unfused f32(f32(f32(r * rstd) * 3) * 0.3) differs in some elements.
    case = NORM_CASES[1]
    x, _, residual = _inputs(case, (256, 200), 3, 0, 0)
    weight = torch.full((200,), 3.0)
    out, rstd, norm_input = norm_forward(x, weight, EPS, residual, 0.3, flavor="cuda")
    scaled = norm_input * rstd.unsqueeze(-1)
    factor = torch.tensor(3.0) * torch.tensor(0.3, dtype=torch.float32)
    assert float(factor) == 0.900000035762786865234375
    assert_bitwise_equal(out, scaled * factor, "out")
    assert not torch.equal(out, (scaled * 3.0) * torch.tensor(0.3, dtype=torch.float32))


@pytest.mark.parametrize("case", [NORM_CASES[0], NORM_CASES[1]], ids=_case_id)
def test_non_finite_rows(case):
    # A NaN or inf in a row: its rstd is NaN (ascend; cuda: 0 for inf), its outputs NaN where the
    # product is undefined, every NaN the canonical +NaN; other rows are unaffected (bit for bit
    # the values of a call without the bad rows). The kernels of the case and of CAST_CASES[0].
    dtype, hidden, _, _, out_scale, flavor = case
    x, weight, residual = _inputs(case, (40, hidden), 9, 0, 0)
    bad = x.clone()
    bad[3, 17] = float("nan")
    bad[5, 150] = float("inf")
    bad[6, 0] = -float("inf")
    out, rstd, _ = norm_forward(bad, weight, EPS, residual, out_scale, flavor=flavor)
    want = reference.norm.norm_forward(bad, weight, EPS, residual, out_scale, flavor)
    assert_bitwise_equal(out, want[0], "out")
    assert_bitwise_equal(rstd, want[1], "rstd")
    canonical_nan = 0x7FC0 if dtype == "bf16" else 0x7FC00000
    assert torch.isnan(rstd[3])
    nan_rows = [3, 5, 6] if flavor == "ascend" else [3]
    assert (rstd[nan_rows].view(torch.int32) == 0x7FC00000).all(), "a NaN rstd is the canonical +NaN"
    assert torch.isnan(out[3]).all() and (out[3].view(torch.int16 if dtype == "bf16" else torch.int32)
                                          == canonical_nan).all()
    if flavor == "ascend":
        assert torch.isnan(rstd[5]) and torch.isnan(out[5]).all()
    else:
        # inf * 0 is NaN; a finite r_i * 0 is a zero of r_i's sign.
        assert rstd[5] == 0 and torch.isnan(out[5, 150]) and (out[5, :150] == 0).all()
    good = [i for i in range(40) if i not in (3, 5, 6)]
    clean_out, clean_rstd, _ = norm_forward(x[good], weight, EPS, residual[good], out_scale, flavor=flavor)
    assert_bitwise_equal(out[good], clean_out, "finite rows")
    assert_bitwise_equal(rstd[good], clean_rstd, "finite rows' rstd")
    if flavor != "ascend":
        return
    options = dict(zip(("use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0", "with_out_bf16"),
                       CAST_CASES[0][6:10], strict=True))
    (data, sf), _, _, _ = norm_forward_and_per_token_cast(bad, weight, EPS, "e4m3", 32, residual, out_scale,
                                                         **options)
    (want_data, want_sf), _, _, _ = norm_forward_and_per_token_cast(bad, weight, EPS, "e4m3", 32, residual,
                                                                    out_scale, **options, target="torch")
    assert_bitwise_equal(data, want_data, "data")
    assert_bitwise_equal(sf, want_sf, "sf")


def test_preallocated_outputs():
    # Given buffers (strided rows) are the ones returned, with the values of a call without them.
    case = NORM_CASES[0]
    x, weight, residual = _inputs(case, (50, 256), 4, 0, 0)
    want = norm_forward(x, weight, EPS, residual, 0.3)
    out = torch.empty(50, 300, dtype=torch.bfloat16)[:, :256]
    residual_out = torch.empty(50, 260, dtype=torch.bfloat16)[:, :256]
    got = norm_forward(x, weight, EPS, residual, 0.3, out=out, residual_out=residual_out)
    assert got[0] is out and got[2] is residual_out
    for a, b, name in zip(got, want, ("out", "rstd", "residual_out"), strict=True):
        assert_bitwise_equal(a, b, name, check_stride=False)

    cast_case = CAST_CASES[1]
    x, weight, residual = _inputs(cast_case, (40, 96), 8, 0, 0)
    options = dict(round_sf=True, use_packed_ue8m0=True, with_out_bf16=True, flavor="cuda")
    (want_data, want_sf), want_bf16, want_rstd, want_sum = norm_forward_and_per_token_cast(
        x, weight, EPS, "e4m3", 32, residual, **options)
    data = torch.empty(40, 96, dtype=torch.float8_e4m3fn)
    sf = torch.zeros(40, 1, dtype=torch.int32)
    out_bf16 = torch.empty(40, 128, dtype=torch.bfloat16)[:, :96]
    residual_out = torch.empty_like(x)
    (got_data, got_sf), got_bf16, got_rstd, got_sum = norm_forward_and_per_token_cast(
        x, weight, EPS, "e4m3", 32, residual, out=(data, sf), out_bf16=out_bf16, residual_out=residual_out,
        **options)
    assert got_data is data and got_sf is sf and got_bf16 is out_bf16 and got_sum is residual_out
    for a, b, name in ((got_data, want_data, "data"), (got_sf, want_sf, "sf"), (got_bf16, want_bf16, "out_bf16"),
                       (got_rstd, want_rstd, "rstd"), (got_sum, want_sum, "residual_out")):
        assert_bitwise_equal(a, b, name, check_stride=False)


def test_no_tokens_launch_nothing(monkeypatch):
    forbid_kernels(monkeypatch, why="B * T == 0")
    x = torch.empty(2, 0, 256, dtype=torch.bfloat16)
    out, rstd, norm_input = norm_forward(x, None, EPS)
    assert out.shape == x.shape and rstd.shape == (2, 0) and norm_input is x
    (data, sf), out_bf16, rstd, _ = norm_forward_and_per_token_cast(x, None, EPS, "e4m3", 32, round_sf=True,
                                                                    use_packed_ue8m0=True, with_out_bf16=True,
                                                                    flavor="cuda")
    assert data.shape == x.shape and sf.shape == (2, 0, 2) and sf.dtype == torch.int32
    assert out_bf16.shape == x.shape and rstd.shape == (2, 0)


def test_custom_op_shapes_on_meta():
    x = torch.empty(3, 5, 128, dtype=torch.bfloat16, device="meta")
    out, rstd, summed = torch.ops.vmi.norm_forward(x, None, EPS, x)
    assert out.shape == x.shape and rstd.shape == (3, 5) and rstd.dtype == torch.float32
    assert summed.shape == x.shape
    data, sf, out_bf16, rstd, summed = torch.ops.vmi.norm_forward_and_per_token_cast(
        x, None, EPS, "e4m3", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    assert data.shape == x.shape and sf.shape == (3, 5, 2) and sf.stride() == (10, 1, 5)
    assert out_bf16.numel() == 0 and summed.numel() == 0
    assert NORM_FORWARD.out is not None


def test_torch_target_and_parallel_entry_points():
    case = NORM_CASES[0]
    x, weight, residual = _inputs(case, (33, 256), 2, 0, 0)
    want = reference.norm.norm_forward(x, weight, EPS, residual, 0.3)
    for got in (norm_forward(x, weight, EPS, residual, 0.3, target="torch"),
                norm_forward_parallel(x, weight, EPS, residual, 0.3)):
        for a, b, name in zip(got, want, ("out", "rstd", "residual_out"), strict=True):
            assert_bitwise_equal(a, b, name)
    with pytest.raises(ValueError, match="target 'torch'"):
        norm_forward_parallel(x, weight, EPS, target="torch")
    with pytest.raises(ValueError, match="target 'torch'"):
        norm_forward_and_per_token_cast_parallel(x, weight, EPS, "e4m3", 32, target="torch")


# ascend-sim: the quantizing kernel with every phase (residual, weight, out_scale, packed
# col-major SF, bf16 side output, Mega MoE SF); the plain and fp32 kernels under ``slow``. The
# wrapping shape puts 3 work tiles of 32 rows on core 0 (129 tiles over 64 cores), more than its 2
# buffer versions: under consumers_first and producers_first a missing wait between pipes shows
# up as wrong data (one reference for both launches: the reference is the cost).
SIM_CAST_CASE = ("bf16", 256, True, True, 0.3, "ascend", True, True, True, True, 16)
SIM_SHAPES = [((1, 256), 0, 0), ((150, 256), 16, 0)]
SIM_WRAPPING_SHAPE = ((4097, 256), 16, 0)


@pytest.mark.parametrize("target", ["ascend-sim"])
def test_cast_on_ascend_sim(target):
    _check_cast(SIM_CAST_CASE, target=target, shapes=SIM_SHAPES, non_finite=True)
    _check_cast(SIM_CAST_CASE, target=target, shapes=[SIM_WRAPPING_SHAPE], non_finite=True,
                schedules=REUSE_SCHEDULES)


@pytest.mark.slow
@pytest.mark.parametrize("case", [NORM_CASES[0], ("fp32", 200, False, False, 1.0, "ascend")], ids=_case_id)
@pytest.mark.parametrize("target", ["ascend-sim"])
def test_norm_forward_on_ascend_sim(case, target):
    _check_norm(case, target=target, shapes=_shapes(case[1])[1:])


@pytest.mark.slow
@pytest.mark.parametrize("target", ["ascend-sim"])
def test_large_hidden_size_on_ascend_sim(target):
    # 128 groups a row: the scale phase over whole registers of groups.
    case = ("bf16", 4096, True, True, 1.0, "ascend", True, True, True, False, 0)
    _check_cast(case, target=target, shapes=[((3, 4096), 0, 0), ((70, 4096), 64, 0)])


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CAST_CASES if c[5] == "ascend"], ids=_case_id)
@pytest.mark.parametrize("target", ["ascend-sim"])
def test_cast_on_ascend_sim_full(case, target):
    _check_cast(case, target=target, shapes=_shapes(case[1])[1:])
