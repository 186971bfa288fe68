"""Property tests (hypothesis): every public vmi-quant op on the cpu target against its torch
reference, bit for bit (data and SF), on drawn shapes, row strides, options and data.

Drawn: token counts (0, 1, tails of the 32-token work tile, several tiles), hidden sizes
(multiples of 64, partial 128-column tiles and partial last groups; multiples of 128 for the
per-block ops), padded input rows (a slice of a wider buffer), preallocated ``out=`` tensors
carved from a sentinel-filled buffer (the bytes around them, and the gaps of a padded row stride,
must stay untouched), and data with special values mixed in (NaN, +-inf, +-0, subnormals, the
largest finite values, E4M3/E2M1/bf16 rounding ties). NaN and inf follow the reference exactly
(README "Non-finite values").

Each property runs twice: in the normal run with the profile's small budget over a few option
combinations (each combination is one compiled kernel), and under ``@pytest.mark.slow`` with at
least ``SLOW_EXAMPLES`` examples over every option combination of the case tables. Profiles and
how to replay a failure: ``vmi_devkit.strategies``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vmi_core.tools.testing import assert_bitwise_equal
from vmi_devkit.cases import cast_cases, pbc_cases, pbcl_cases, ptc_cases, ptccb_cases
from vmi_devkit.strategies import (
    Guarded,
    assert_every_option_value_drawn,
    drawn_values,
    float_matrix,
    guarded_like,
    hidden_sizes,
    load_profile,
    plain_input,
    slow_settings,
    token_counts,
)
from vmi_quant import (
    cast,
    cast_back,
    per_block_cast,
    per_block_cast_lossless,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
    per_token_cast,
    per_token_cast_and_cast_back,
    per_token_cast_back,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
    reference,
)
from vmi_quant.reference.elementwise import cast as reference_elementwise_cast
from vmi_quant.reference.lossless import per_block_cast_lossless as reference_lossless

# The default-budget tests run in the normal test command; their `slow` twins (>= 1000 examples
# each) run under `nox -s slow`, and CI's rotating share of the slow sweeps leaves them out.
pytestmark = [pytest.mark.properties]


load_profile()

# --- per_token_cast and its sf-only / precomputed-SF forms --------------------------------------------------------

PTC_DEFAULT = [ptc_cases.COVERING[0], ptc_cases.COVERING[8]]  # fp32 SF row-major; packed UE8M0 column-major
PTC_ALL = ptc_cases.COVERING + ptc_cases.FULL


def check_per_token_cast(data, cases, stochastic_choices):
    in_dtype, fmt, npc, sf_mode, col_major, flavor = data.draw(st.sampled_from(cases), label="case")
    stochastic = data.draw(st.sampled_from(stochastic_choices), label="stochastic_cast")
    options = ptc_cases.sf_options(sf_mode, col_major)
    m = data.draw(token_counts(), label="tokens")
    k = data.draw(hidden_sizes(), label="hidden")
    x = plain_input(data, m, k, ptc_cases.DTYPES[in_dtype], npc)
    ref_data, ref_sf = reference.cast(x, fmt, (1, npc), stochastic=stochastic, flavor=flavor, **options)
    g_data = guarded_like(data, ref_data, label="out data")
    g_sf = guarded_like(data, ref_sf, zero=True, label="out sf") if g_data is not None else None
    out = None if g_data is None else (g_data.tensor, g_sf.tensor if g_sf is not None else None)
    got_data, got_sf = per_token_cast(x, fmt, npc, stochastic_cast=stochastic, flavor=flavor, out=out,
                                      target="cpu", **options)
    assert_bitwise_equal(got_data, ref_data, "data", check_stride=g_data is None)
    assert_bitwise_equal(got_sf, ref_sf, "sf", check_stride=g_sf is None)
    for guard, name in ((g_data, "out data"), (g_sf, "out sf")):
        if guard is not None:
            assert got_data.data_ptr() == g_data.tensor.data_ptr()
            guard.check(name)


@given(st.data())
def test_per_token_cast(data):
    check_per_token_cast(data, PTC_DEFAULT, [False, True])


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_token_cast_slow(data):
    check_per_token_cast(data, PTC_ALL, [False, True])


def check_per_token_cast_sf_only(data, cases):
    in_dtype, fmt, npc, sf_mode, col_major, flavor = data.draw(st.sampled_from(cases), label="case")
    options = ptc_cases.sf_options(sf_mode, col_major)
    x = plain_input(data, data.draw(token_counts(), label="tokens"), data.draw(hidden_sizes(), label="hidden"),
                    ptc_cases.DTYPES[in_dtype], npc)
    _, ref_sf = reference.cast(x, fmt, (1, npc), flavor=flavor, **options)
    g_sf = guarded_like(data, ref_sf, zero=True, label="out sf")
    sf = per_token_cast_with_sf_only(x, fmt, npc, flavor=flavor, out_sf=None if g_sf is None else g_sf.tensor,
                                     target="cpu", **options)
    assert_bitwise_equal(sf, ref_sf, "sf", check_stride=g_sf is None)
    if g_sf is not None:
        g_sf.check("out sf")


@given(st.data())
def test_per_token_cast_with_sf_only(data):
    check_per_token_cast_sf_only(data, [ptc_cases.COVERING[0]])


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_token_cast_with_sf_only_slow(data):
    check_per_token_cast_sf_only(data, PTC_ALL)


# A precomputed SF is row-major and unpacked: fp32, power-of-two fp32 or E4M3.
PTC_PRECOMPUTED_ALL = [c for c in PTC_ALL if c[3] != "packed" and not c[4]]


def check_per_token_cast_precomputed(data, cases):
    in_dtype, fmt, npc, sf_mode, col_major, flavor = data.draw(st.sampled_from(cases), label="case")
    options = ptc_cases.sf_options(sf_mode, col_major)
    x = plain_input(data, data.draw(token_counts(), label="tokens"), data.draw(hidden_sizes(), label="hidden"),
                    ptc_cases.DTYPES[in_dtype], npc)
    # The op's own SF for x, or (drawn) that of another input of the same shape.
    source = x if data.draw(st.booleans(), label="own sf") else float_matrix(
        data, x.shape[0], x.shape[1], x.dtype, group=npc)
    _, sf = reference.cast(source, fmt, (1, npc), flavor=flavor, **options)
    ref = reference.cast(x, fmt, (1, npc), sf=sf, flavor=flavor, **options)
    g = guarded_like(data, ref, label="out")
    got = per_token_cast_with_precomputed_sf(x, fmt, npc, sf, flavor=flavor, out=None if g is None else g.tensor,
                                             target="cpu", **options)
    assert_bitwise_equal(got, ref, "data", check_stride=g is None)
    if g is not None:
        g.check("out")


@given(st.data())
def test_per_token_cast_with_precomputed_sf(data):
    check_per_token_cast_precomputed(data, [ptc_cases.COVERING[0]])


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_token_cast_with_precomputed_sf_slow(data):
    check_per_token_cast_precomputed(data, PTC_PRECOMPUTED_ALL)


# --- cast --------------------------------------------------------------------------------------------------------

CAST_ALL = [(a, b, False) for a, b in cast_cases.CAST_PAIRS] + [(a, b, True) for a, b in cast_cases.SR_PAIRS]
CAST_DEFAULT = [("fp32", "e4m3", False), ("bf16", "e4m3", True)]


def cast_input(data, shape, fmt):
    if fmt == "e4m3":  # every code, the NaNs 0x7F / 0xFF included
        seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
        g = torch.Generator().manual_seed(seed)
        return torch.randint(256, shape, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    n = torch.Size(shape).numel()
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    return float_matrix(data, 1, n, cast_cases.DTYPES[fmt], nonfinite=nonfinite).reshape(shape)


def check_cast(data, cases):
    src, dst, stochastic = data.draw(st.sampled_from(cases), label="case")
    shape = data.draw(st.one_of(
        st.sampled_from([(0,), (), (1,), (4,), (3, 5, 68)]),
        st.lists(st.integers(0, 40), min_size=1, max_size=3).map(tuple),
        st.integers(0, 3000).map(lambda n: (n,))), label="shape")
    if stochastic:  # needs x.numel() % 4 == 0
        shape = (*shape, 4)
    x = cast_input(data, shape, src)
    out_dtype = cast_cases.DTYPES[dst]
    got = cast(x, out_dtype, stochastic, target="cpu", flavor=data.draw(st.sampled_from(["ascend", "cuda"])))
    assert_bitwise_equal(got, reference_elementwise_cast(x, out_dtype, stochastic), f"{src}->{dst} sr={stochastic}")


@given(st.data())
def test_cast(data):
    check_cast(data, CAST_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_cast_slow(data):
    check_cast(data, CAST_ALL)


# --- cast_back / per_token_cast_back -----------------------------------------------------------------------------

CAST_BACK_ALL = cast_cases.CAST_BACK_COVERING + cast_cases.CAST_BACK_FULL
CAST_BACK_DEFAULT = [cast_cases.CAST_BACK_COVERING[0], cast_cases.CAST_BACK_COVERING[7]]


def check_cast_back(data, cases):
    fmt, block, sf_mode, col_major, out, flavor = data.draw(st.sampled_from(cases), label="case")
    options = cast_cases.sf_options(sf_mode, col_major)
    if sf_mode == "fp32" and data.draw(st.booleans(), label="round_sf"):
        options["round_sf"] = True
    m = data.draw(token_counts(), label="tokens")
    k = data.draw(hidden_sizes(), label="hidden")
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    x = float_matrix(data, m, k, torch.float32, nonfinite=nonfinite, group=block[1])
    q = reference.cast(x, fmt, block, flavor=flavor, **options)
    expected = reference.cast_back(q, out, block, flavor=flavor)
    if block[0] == 1 and data.draw(st.booleans(), label="per_token_cast_back"):
        got = per_token_cast_back(q, out, block[1], target="cpu", flavor=flavor)
    else:
        got = cast_back(q, out, block, target="cpu", flavor=flavor)
    assert_bitwise_equal(got, expected, f"{fmt} {block} sf={sf_mode} col={col_major} -> {out} {flavor}")


@given(st.data())
def test_cast_back(data):
    check_cast_back(data, CAST_BACK_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_cast_back_slow(data):
    check_cast_back(data, CAST_BACK_ALL)


# --- per_token_cast_and_cast_back (in place) ------------------------------------------------------------------------

PTCCB_ALL = [(*c, flavor) for c in ptccb_cases.COVERING + ptccb_cases.FULL for flavor in ("ascend", "cuda")]
PTCCB_DEFAULT = [(*ptccb_cases.COVERING[0], "ascend"), (*ptccb_cases.COVERING[6], "cuda")]


def check_per_token_cast_and_cast_back(data, cases):
    in_dtype, fmt, npc, sf_mode, flavor = data.draw(st.sampled_from(cases), label="case")
    round_sf, use_e4m3_sf = ptccb_cases.SF_MODES[sf_mode]
    m = data.draw(token_counts(), label="tokens")
    k = data.draw(hidden_sizes(ptccb_cases.hidden_unit(npc)), label="hidden")
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    x = float_matrix(data, m, k, ptccb_cases.DTYPES[in_dtype], nonfinite=nonfinite, group=npc)
    expected = reference.cast_and_cast_back(x, fmt, npc, round_sf=round_sf, use_e4m3_sf=use_e4m3_sf, flavor=flavor)
    # x in place, rows maybe padded, inside a sentinel-guarded buffer.
    pad = data.draw(st.sampled_from([0, 5, 64]), label="row padding")
    guard = Guarded((m, k), (k + pad, 1), x.dtype)
    guard.tensor.copy_(x)
    per_token_cast_and_cast_back(guard.tensor, fmt, npc, round_sf, use_e4m3_sf, target="cpu", flavor=flavor)
    assert_bitwise_equal(guard.tensor, expected, f"{in_dtype} {fmt} npc={npc} sf={sf_mode} {flavor}",
                         check_stride=False)
    guard.check("x")


@given(st.data())
def test_per_token_cast_and_cast_back(data):
    check_per_token_cast_and_cast_back(data, PTCCB_DEFAULT)


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_token_cast_and_cast_back_slow(data):
    check_per_token_cast_and_cast_back(data, PTCCB_ALL)


# --- per_block_cast and its sf-only / precomputed-SF forms --------------------------------------------------------

PBC_ALL = pbc_cases.COVERING + pbc_cases.FULL
PBC_DEFAULT = [pbc_cases.COVERING[0], pbc_cases.COVERING[5]]


def pbc_options(sf_mode, col_major):
    round_sf, packed = pbc_cases.SF_MODES[sf_mode]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col_major)


def pbc_input(data, case):
    in_dtype, fmt, block, sf_mode, col_major, flavor = case
    m = data.draw(st.integers(0, 2), label="token tiles") * 128
    k = data.draw(hidden_sizes(128, 384), label="hidden")
    return plain_input(data, m, k, pbc_cases.DTYPES[in_dtype], block[1])


def check_per_block_cast(data, cases, mode):
    case = data.draw(st.sampled_from(cases), label="case")
    in_dtype, fmt, block, sf_mode, col_major, flavor = case
    options = pbc_options(sf_mode, col_major)
    x = pbc_input(data, case)
    ref_data, ref_sf = reference.cast(x, fmt, block, flavor=flavor, **options)
    label = f"{case} shape={tuple(x.shape)}"
    if mode == "cast":
        g_data = guarded_like(data, ref_data, label="out data")
        g_sf = guarded_like(data, ref_sf, zero=True, label="out sf") if g_data is not None else None
        out = None if g_data is None else (g_data.tensor, None if g_sf is None else g_sf.tensor)
        got_data, got_sf = per_block_cast(x, fmt, block, out=out, flavor=flavor, target="cpu", **options)
        assert_bitwise_equal(got_data, ref_data, f"data {label}", check_stride=g_data is None)
        assert_bitwise_equal(got_sf, ref_sf, f"sf {label}", check_stride=g_sf is None)
        guards = [(g_data, "out data"), (g_sf, "out sf")]
    elif mode == "sf_only":
        g_sf = guarded_like(data, ref_sf, zero=True, label="out sf")
        got_sf = per_block_cast_with_sf_only(x, fmt, block, out_sf=None if g_sf is None else g_sf.tensor,
                                             flavor=flavor, target="cpu", **options)
        assert_bitwise_equal(got_sf, ref_sf, f"sf {label}", check_stride=g_sf is None)
        guards = [(g_sf, "out sf")]
    else:
        source = x if data.draw(st.booleans(), label="own sf") else pbc_input(data, case)[:x.shape[0], :x.shape[1]]
        if source.shape != x.shape:
            source = x
        _, sf = reference.cast(source, fmt, block, flavor=flavor, **options)
        ref = reference.cast(x, fmt, block, sf=sf, flavor=flavor, **options)
        g = guarded_like(data, ref, label="out")
        got = per_block_cast_with_precomputed_sf(x, fmt, block, sf, out=None if g is None else g.tensor,
                                                 flavor=flavor, target="cpu", **options)
        assert_bitwise_equal(got, ref, f"data {label}", check_stride=g is None)
        guards = [(g, "out")]
    for guard, name in guards:
        if guard is not None:
            guard.check(name)


@given(st.data())
def test_per_block_cast(data):
    check_per_block_cast(data, PBC_DEFAULT, "cast")


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_block_cast_slow(data):
    check_per_block_cast(data, PBC_ALL, "cast")


@given(st.data())
def test_per_block_cast_with_sf_only(data):
    check_per_block_cast(data, [pbc_cases.COVERING[0]], "sf_only")


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_block_cast_with_sf_only_slow(data):
    check_per_block_cast(data, PBC_ALL, "sf_only")


PBC_PRECOMPUTED_ALL = [c for c in PBC_ALL if c[3] != "packed" and not c[4]]


@given(st.data())
def test_per_block_cast_with_precomputed_sf(data):
    check_per_block_cast(data, [pbc_cases.COVERING[0]], "cast_only")


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_block_cast_with_precomputed_sf_slow(data):
    check_per_block_cast(data, PBC_PRECOMPUTED_ALL, "cast_only")


# --- per_block_cast_lossless ---------------------------------------------------------------------------------------

PBCL_ALL = pbcl_cases.COVERING + pbcl_cases.FULL


def check_per_block_cast_lossless(data, cases):
    case = data.draw(st.sampled_from(cases), label="case")
    x_block, x_mode, out_block, out_mode, flavor = case
    m = data.draw(st.integers(0, 2), label="token tiles") * 128
    k = data.draw(hidden_sizes(128, 384), label="hidden")
    # FP4 input whose block scales stay within the 11 binades an output block may span: magnitudes
    # raised to at least max|x| / 2^9 (what the op requires to be lossless).
    x = float_matrix(data, m, k, torch.float32, group=x_block[1])
    x = torch.where(torch.isfinite(x), x, 1.0)
    if x.numel():
        floor = x.abs().max() / 2**9
        x = torch.where(x.abs() < floor, torch.copysign(floor.expand_as(x), x), x)
    q = reference.cast(x, "e2m1", x_block, flavor=flavor, **pbcl_cases.sf_options(x_mode))
    options = pbcl_cases.sf_options(out_mode)
    got_data, got_sf = per_block_cast_lossless(q, "e4m3", x_block, out_block, flavor=flavor, target="cpu", **options)
    ref_data, ref_sf = reference_lossless(q, "e4m3", x_block, out_block, flavor=flavor, **options)
    label = f"{pbcl_cases.case_id(case)} shape={(m, k)}"
    assert_bitwise_equal(got_data, ref_data, f"data {label}")
    assert_bitwise_equal(got_sf, ref_sf, f"sf {label}")
    assert_bitwise_equal(reference.cast_back((got_data, got_sf), "fp32", out_block, flavor=flavor),
                         reference.cast_back(q, "fp32", x_block, flavor=flavor), f"lossless {label}")


@given(st.data())
def test_per_block_cast_lossless(data):
    check_per_block_cast_lossless(data, [pbcl_cases.COVERING[0]])


@pytest.mark.slow
@slow_settings()
@given(st.data())
def test_per_block_cast_lossless_slow(data):
    check_per_block_cast_lossless(data, PBCL_ALL)


# --- what the slow twins draw ---------------------------------------------------------------------------------------

def _ptc_sf(case, option):
    return ptc_cases.sf_options(case[3], case[4])[option]


# Per op, the values of each option ``vmi run OP -o name=value`` documents that the slow twins draw
# (from the case tables they sample); a documented value no twin draws fails the test below.
DRAWN = {
    "cast": drawn_values(CAST_ALL, in_dtype=lambda c: c[0], dtype=lambda c: c[1],
                         stochastic_rounding=lambda c: c[2]),
    "cast_back": {
        **drawn_values(CAST_BACK_ALL, x_fmt=lambda c: c[0], fmt=lambda c: c[4], block_m=lambda c: c[1][0],
                       block_k=lambda c: c[1][1], use_tma_aligned_col_major_sf=lambda c: c[3],
                       use_packed_ue8m0=lambda c: cast_cases.SF_MODES[c[2]][1],
                       use_e4m3_sf=lambda c: cast_cases.SF_MODES[c[2]][2]),
        "round_sf": {False, True},  # drawn for fp32 SF, implied by packed SF
    },
    "per_token_cast": {
        **drawn_values(PTC_ALL, in_dtype=lambda c: c[0], fmt=lambda c: c[1], num_per_channels=lambda c: c[2],
                       round_sf=lambda c: _ptc_sf(c, "round_sf"),
                       use_packed_ue8m0=lambda c: _ptc_sf(c, "use_packed_ue8m0"),
                       use_e4m3_sf=lambda c: _ptc_sf(c, "use_e4m3_sf"),
                       use_tma_aligned_col_major_sf=lambda c: _ptc_sf(c, "use_tma_aligned_col_major_sf")),
        "stochastic_cast": {False, True},
    },
    "per_token_cast_and_cast_back": drawn_values(
        PTCCB_ALL, in_dtype=lambda c: c[0], fmt=lambda c: c[1], num_per_channels=lambda c: c[2],
        round_sf=lambda c: ptccb_cases.SF_MODES[c[3]][0], use_e4m3_sf=lambda c: ptccb_cases.SF_MODES[c[3]][1]),
    "per_block_cast": drawn_values(
        PBC_ALL, in_dtype=lambda c: c[0], fmt=lambda c: c[1], block_m=lambda c: c[2][0], block_k=lambda c: c[2][1],
        round_sf=lambda c: pbc_cases.SF_MODES[c[3]][0], use_packed_ue8m0=lambda c: pbc_cases.SF_MODES[c[3]][1],
        use_tma_aligned_col_major_sf=lambda c: c[4]),
    "per_block_cast_lossless": drawn_values(
        PBCL_ALL, x_block_m=lambda c: c[0][0], x_block_k=lambda c: c[0][1], out_block_m=lambda c: c[2][0],
        out_block_k=lambda c: c[2][1], use_tma_aligned_col_major_sf=lambda c: pbcl_cases.SF_MODES[c[3]][0],
        use_packed_ue8m0=lambda c: pbcl_cases.SF_MODES[c[3]][2]),
}


def test_the_slow_twins_draw_every_documented_option_value():
    assert_every_option_value_drawn(DRAWN)
