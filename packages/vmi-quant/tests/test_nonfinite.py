"""NaN and ±inf input through every quantization op that reduces over a group, bit for bit.

Each case fills a matrix with non-finite patterns, one per group (a single NaN of several
payloads and signs, +inf, -inf, both infinities, NaN with infinities, a whole group NaN or
infinite, infinities or NaN among zeros, NaN in a partial last group) and compares the kernel
with the torch reference on ``cpu`` (both flavors) and, for a covering subset, on
``ascend-sim``. Every NaN an op writes must be the canonical +NaN (fp32 0x7FC00000, bf16 0x7FC0,
E4M3 code 0x7F), and the README's "Non-finite values" policy is checked on its own too, so the
tests do not lean on the reference alone. Each option combination is one compiled kernel, so
the matrix is a covering set: every SF mode and output format, both flavors and input dtypes.
"""

from __future__ import annotations

import pytest
import torch

from vmi_core.formats import e2m1_unpack, e4m3_decode, f32_bits
from vmi_core.targets import get_flavor
from vmi_core.tools.testing import assert_bitwise_equal, randn
from vmi_devkit.cases.ptc_cases import DTYPES, SF_MODES
from vmi_devkit.errors import forbid_kernels
from vmi_quant import (
    per_block_cast,
    per_block_cast_lossless,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
    per_channel_cast,
    per_token_cast,
    per_token_cast_and_cast_back,
    per_token_cast_with_precomputed_sf,
    per_token_cast_with_sf_only,
    reference,
)
from vmi_quant.reference.cast import _decode_sf

CANONICAL_NAN = 0x7FC00000
INF_BITS = 0x7F800000
E4M3_448_BITS = 0x43E00000
# Codes: the largest magnitude, and what a NaN product becomes (E2M1 has no NaN: +6).
Q_CODE = {"e4m3": 0x7E, "e2m1": 0x7}
NAN_CODE = {"e4m3": 0x7F, "e2m1": 0x7}
SIGN_CODE = {"e4m3": 0x80, "e2m1": 0x8}

# Bit patterns per input dtype: NaNs (canonical, negative with a payload, signaling, all ones),
# +inf and the sign bit.
_NANS = {torch.float32: (0x7FC00000, 0xFFC12345, 0x7F800001, 0xFFFFFFFF),
         torch.bfloat16: (0x7FC0, 0xFFC1, 0x7F81, 0xFFFF)}
_INF = {torch.float32: 0x7F800000, torch.bfloat16: 0x7F80}
_SIGN = {torch.float32: 0x80000000, torch.bfloat16: 0x8000}
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16}
PATTERNS = ("nan", "pinf", "ninf", "inf_pair", "nan_inf", "all_nan", "all_inf", "inf_zeros", "nan_zeros")


def _signed(value: int, width: int) -> int:
    return value - (1 << width) if value >> (width - 1) else value


def _fill(bits: torch.Tensor, dtype, kind: str, rows: tuple[int, int], cols: tuple[int, int], g: int) -> None:
    """Write pattern ``kind`` into the group ``bits[rows, cols]`` (integer view); ``g`` varies it."""
    width = 8 * bits.element_size()
    nans, inf, sign = _NANS[dtype], _INF[dtype], _SIGN[dtype]
    (r0, r1), (c0, c1) = rows, cols
    n = (r1 - r0) * (c1 - c0)

    def put(k: int, pattern: int) -> None:
        p = (g * 7 + k * 13) % n
        bits[r0 + p // (c1 - c0), c0 + p % (c1 - c0)] = _signed(pattern, width)

    region = bits[r0:r1, c0:c1]
    if kind in ("all_nan", "all_inf", "inf_zeros", "nan_zeros"):
        flat = torch.arange(n).reshape(region.shape)
        if kind == "all_nan":
            values = torch.tensor([_signed(v, width) for v in nans])[flat % len(nans)]
        else:
            magnitude = inf if kind == "all_inf" else 0
            values = torch.where(flat % 2 == 1, _signed(magnitude | sign, width), magnitude)
        region.copy_(values)
    if kind in ("nan", "nan_inf", "nan_zeros"):
        put(0, nans[g % len(nans)])
    if kind in ("pinf", "inf_pair", "inf_zeros"):
        put(0, inf)
    if kind == "ninf":
        put(0, inf | sign)
    if kind in ("inf_pair", "nan_inf"):
        put(1, inf | sign)
    if kind == "nan_inf":
        put(2, inf)


def nonfinite_input(shape, dtype, group: tuple[int, int], seed: int) -> torch.Tensor:
    """``randn`` in ``dtype`` with one pattern of ``PATTERNS`` in most groups of shape ``group``,
    and a NaN in the last column of the first and last rows (a partial last group when the
    group does not divide the width)."""
    m, k = shape
    gm, gk = group
    x = randn(shape, seed).to(dtype)
    bits = x.view(_INT_VIEW[dtype])
    slots = len(PATTERNS) + 3  # a few groups stay finite
    for gi in range(-(-m // gm)):
        for gj in range(-(-k // gk)):
            slot = (gi * 5 + gj * 3 + seed) % slots
            if slot < len(PATTERNS):
                _fill(bits, dtype, PATTERNS[slot], (gi * gm, min(m, gi * gm + gm)), (gj * gk, min(k, gj * gk + gk)),
                      gi + gj)
    for row in (0, m - 1):
        bits[row, k - 1] = _signed(_NANS[dtype][(row + 1) % 4], 8 * bits.element_size())
    return x


# --- checks -----------------------------------------------------------------------------------

def _codes(data: torch.Tensor, fmt: str) -> torch.Tensor:
    return (data.view(torch.uint8) if fmt == "e4m3" else e2m1_unpack(data)).to(torch.int64)


def assert_canonical_nans(t: torch.Tensor, name: str) -> None:
    """Every NaN in ``t`` is the canonical +NaN (E4M3 data: no 0xFF code)."""
    if t.dtype == torch.float8_e4m3fn:
        bad = t.view(torch.uint8) == 0xFF
    elif t.dtype == torch.float32:
        bad = torch.isnan(t) & (f32_bits(t) != CANONICAL_NAN)
    elif t.dtype == torch.bfloat16:
        bad = torch.isnan(t) & (t.view(torch.int16) != 0x7FC0)
    else:
        return
    assert not bool(bad.any()), f"{name}: {int(bad.sum())} non-canonical NaN(s), first at {bad.nonzero()[0].tolist()}"


def _group_any(mask: torch.Tensor, block) -> torch.Tensor:
    """Per element: whether its ``block`` group holds any set element of ``mask``."""
    (m, k), (bm, bk) = mask.shape, block
    nbm, nbk = -(-m // bm), -(-k // bk)
    padded = torch.nn.functional.pad(mask, (0, nbk * bk - k, 0, nbm * bm - m))
    groups = padded.reshape(nbm, bm, nbk, bk).any(dim=3).any(dim=1)
    return groups.repeat_interleave(bm, 0).repeat_interleave(bk, 1)[:m, :k]


def assert_policy(x, data, sf, fmt, sf_mode, block, flavor, label) -> None:
    """The README's "Non-finite values" rules, independent of the reference: the SF and the codes
    of every group holding NaN, and of every group holding inf but no NaN."""
    xf = x.float()
    shape = tuple(xf.shape)
    nan = _group_any(torch.isnan(xf), block)
    inf = _group_any(torch.isinf(xf), block) & ~nan
    assert bool(nan.any()), "the input lost its NaN patterns"
    sf_bits = f32_bits(_decode_sf(sf, shape, block, get_flavor(flavor))).repeat_interleave(block[0], 0)
    sf_bits = sf_bits.repeat_interleave(block[1], 1)[:shape[0], :shape[1]]
    rounded = sf_mode in ("pow2", "packed")
    nan_sf = 0 if rounded else CANONICAL_NAN  # E4M3 code 0x7F decodes to the canonical NaN
    inf_sf = E4M3_448_BITS if sf_mode == "e4m3" else INF_BITS
    assert bool((sf_bits[nan] == nan_sf).all()), f"sf of NaN groups [{label}]"
    assert bool((sf_bits[inf] == inf_sf).all()), f"sf of inf groups [{label}]"
    if data is None:
        return
    codes = _codes(data, fmt)
    sign = torch.where(f32_bits(xf) >> 31 == 1, SIGN_CODE[fmt], 0)
    if rounded:
        # sf 0.0, sf_inv inf: x · inf saturates to ±Q; 0 · inf and NaN are NaN.
        nan_product = (xf == 0) | torch.isnan(xf)
        expected = torch.where(nan_product, NAN_CODE[fmt], Q_CODE[fmt] | sign)
    else:
        expected = torch.full_like(codes, NAN_CODE[fmt])
    assert torch.equal(codes[nan], expected[nan]), f"codes of NaN groups [{label}]"
    if sf_mode == "e4m3":
        # sf 448, sf_inv 1/448: only the infinities themselves are known, they saturate.
        pick = inf & torch.isinf(xf)
        assert torch.equal(codes[pick], (Q_CODE[fmt] | sign)[pick]), f"codes of inf groups [{label}]"
    else:
        # sf inf, sf_inv 0: signed zeros, and NaN for inf · 0.
        expected = torch.where(torch.isinf(xf), NAN_CODE[fmt], sign)
        assert torch.equal(codes[inf], expected[inf]), f"codes of inf groups [{label}]"


def _options(sf_mode: str, col_major: bool = False) -> dict:
    round_sf, packed, e4m3_sf = SF_MODES[sf_mode]
    return dict(round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf,
                use_tma_aligned_col_major_sf=col_major)


def _assert_same(got, expected, label) -> None:
    for name, a, b in zip(("data", "sf"), got, expected, strict=True):
        assert_bitwise_equal(a, b, f"{name} [{label}]")
        assert_canonical_nans(a, f"{name} [{label}]")


# --- per_token_cast ---------------------------------------------------------------------------

PTC_SHAPE = (37, 192)  # a 32-token tile tail; 192 = 128 + a partial group of 64 with npc 128
# (in_dtype, fmt, num_per_channels, sf_mode, col_major, flavor): every SF mode, both formats,
# flavors and dtypes; npc 128 has a partial last group.
PTC_CASES = [
    ("fp32", "e4m3", 128, "fp32", False, "ascend"),
    ("bf16", "e2m1", 32, "e4m3", True, "cuda"),
    ("fp32", "e2m1", 128, "pow2", True, "ascend"),
    ("bf16", "e4m3", 64, "packed", False, "cuda"),
]


def _ptc_label(case, target):
    return "-".join(map(str, case)) + f" target={target}"


def _check_per_token_cast(case, target):
    in_dtype, fmt, npc, sf_mode, col_major, flavor = case
    options = _options(sf_mode, col_major)
    x = nonfinite_input(PTC_SHAPE, DTYPES[in_dtype], (1, npc), seed=npc)
    label = _ptc_label(case, target)
    got = per_token_cast(x, fmt, npc, target=target, flavor=None if target == "ascend-sim" else flavor, **options)
    expected = per_token_cast(x, fmt, npc, target="torch", flavor=flavor, **options)
    _assert_same(got, expected, label)
    assert_policy(x, *got, fmt, sf_mode, (1, npc), flavor, label)


@pytest.mark.parametrize("case", PTC_CASES, ids=lambda c: "-".join(map(str, c)))
def test_per_token_cast(case):
    _check_per_token_cast(case, "cpu")


@pytest.mark.parametrize("fmt,sf_mode", [("e2m1", "pow2"), ("e4m3", "fp32")])
def test_stochastic_cast_of_a_nan_product(fmt, sf_mode):
    # An inf in a group with a power-of-two SF makes `inf · 0` NaN (negative on x86): that NaN has no
    # defined sign, so it is made +NaN before the quad hash and the rounding (E2M1 +6, never -6).
    x = randn((3, 64), 9).to(torch.bfloat16)
    x[0, 0] = float("inf")
    x[1, 5] = float("nan")
    options = _options(sf_mode)
    got = per_token_cast(x, fmt, 16, stochastic_cast=True, target="cpu", flavor="ascend", **options)
    expected = per_token_cast(x, fmt, 16, stochastic_cast=True, target="torch", flavor="ascend", **options)
    _assert_same(got, expected, f"stochastic {fmt} {sf_mode}")
    nan_code = {"e4m3": 0x7F, "e2m1": 0x7}[fmt]
    codes = _codes(got[0], fmt)
    assert codes[0, 0] == nan_code
    assert codes[1, 5] == nan_code


def test_per_token_cast_with_sf_only():
    # Packed int16 words: round_sf, the exponent bytes 0 (NaN) and 255 (inf).
    sf_mode, fmt, flavor = "packed", "e2m1", "ascend"
    options = _options(sf_mode)
    x = nonfinite_input(PTC_SHAPE, torch.float32, (1, 128), seed=3)
    sf = per_token_cast_with_sf_only(x, fmt, 128, target="cpu", flavor=flavor, **options)
    _, expected = per_token_cast(x, fmt, 128, target="torch", flavor=flavor, **options)
    label = f"sf_only {flavor}"
    assert_bitwise_equal(sf, expected, label)
    assert_canonical_nans(sf, label)
    assert_policy(x, None, sf, fmt, sf_mode, (1, 128), flavor, label)


def _given_sf(x, npc, e4m3: bool) -> torch.Tensor:
    """A valid SF for ``x`` with NaN, inf, 0 and -0 (fp32) or NaN, -NaN, 0 and 448 (E4M3) mixed in."""
    _, sf = per_token_cast(x, "e4m3", npc, target="torch", use_e4m3_sf=e4m3)
    bits = sf.view(torch.uint8 if e4m3 else torch.int32)
    specials = (0x7F, 0xFF, 0x00, 0x7E) if e4m3 else (0x7FC00000, 0x7F800000, 0, _signed(0x80000000, 32))
    for i in range(sf.shape[0]):
        for j in range(sf.shape[1]):
            if (i + j) % 3 == 0:
                bits[i, j] = specials[(i // 3 + j) % len(specials)]
    return sf


@pytest.mark.parametrize("in_dtype,fmt,e4m3_sf,flavor", [("fp32", "e4m3", False, "ascend"),
                                                         ("bf16", "e2m1", True, "cuda")])
def test_per_token_cast_with_precomputed_sf(in_dtype, fmt, e4m3_sf, flavor):
    npc = 32
    x = randn(PTC_SHAPE, 5).to(DTYPES[in_dtype])
    x[::2, ::5] = 0.0  # zeros meet the inf multiplier of a zero sf: NaN
    x[1::4, 3::7] = float("nan")
    sf = _given_sf(x, npc, e4m3_sf)
    got = per_token_cast_with_precomputed_sf(x, fmt, npc, sf, use_e4m3_sf=e4m3_sf, target="cpu", flavor=flavor)
    expected = per_token_cast_with_precomputed_sf(x, fmt, npc, sf, use_e4m3_sf=e4m3_sf, target="torch",
                                                  flavor=flavor)
    label = f"precomputed {in_dtype}->{fmt} e4m3_sf={e4m3_sf}"
    assert_bitwise_equal(got, expected, label)
    assert_canonical_nans(got, label)
    # A +0.0 sf (sf_inv inf): ±Q for non-zero x, the NaN code for 0 · inf and NaN.
    value = e4m3_decode(sf.view(torch.uint8)) if e4m3_sf else sf
    zero_sf = (f32_bits(value) == 0).repeat_interleave(npc, 1)[:, :x.shape[1]]
    xf = x.float()
    codes = _codes(got, fmt)
    sign = torch.where(f32_bits(xf) >> 31 == 1, SIGN_CODE[fmt], 0)
    expected_codes = torch.where((xf == 0) | torch.isnan(xf), NAN_CODE[fmt], Q_CODE[fmt] | sign)
    assert bool(zero_sf.any())
    assert torch.equal(codes[zero_sf], expected_codes[zero_sf]), label


# (data fmt, its SF dtype, x_block_size, output fmt, sf_mode, flavor): an fp32 input SF holding
# NaN, ±inf and 0 (ascend: dequantize first), and an E4M3 input SF holding 0x7F, 0xFF, 0x7E and 0
# (cuda: scale first); E4M3 data also carries NaN codes.
QT_CASES = [
    ("e4m3", "fp32", (1, 32), "e2m1", "pow2", "ascend"),
    ("e2m1", "e4m3", (32, 32), "e4m3", "fp32", "cuda"),
]


@pytest.mark.parametrize("case", QT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_per_token_cast_quantized_input(case):
    in_fmt, sf_kind, x_block, fmt, sf_mode, flavor = case
    npc = 64
    x0 = randn(PTC_SHAPE, 11)
    data, sf_in = reference.cast(x0, in_fmt, x_block, use_e4m3_sf=sf_kind == "e4m3", flavor=flavor)
    if sf_kind == "fp32":
        specials = (0x7FC00000, 0x7F800000, 0xFF800000, 0, 0xFFC12345)
        sf_bits = sf_in.view(torch.int32)
    else:
        specials = (0x7F, 0xFF, 0x7E, 0x00)
        sf_bits = sf_in.view(torch.uint8)
    for i in range(sf_in.shape[0]):
        for j in range(sf_in.shape[1]):
            if (2 * i + j) % 4 == 0:
                sf_bits[i, j] = _signed(specials[(i + j) % len(specials)], 8 * sf_bits.element_size())
    if in_fmt == "e4m3":
        data.view(torch.uint8)[5::6, 7::19] = 0xFF
        data.view(torch.uint8)[2::9, 40::33] = 0x7F
    x = (data, sf_in)
    options = _options(sf_mode)
    got = per_token_cast(x, fmt, npc, x_block_size=x_block, target="cpu", flavor=flavor, **options)
    expected = per_token_cast(x, fmt, npc, x_block_size=x_block, target="torch", flavor=flavor, **options)
    label = "-".join(map(str, case))
    _assert_same(got, expected, label)
    dequantized = reference.cast_back(x, "fp32", x_block, flavor=flavor)
    assert_policy(dequantized, *got, fmt, sf_mode, (1, npc), flavor, label)


# --- per_block_cast ---------------------------------------------------------------------------

PBC_SHAPE = (256, 384)
# (in_dtype, fmt, block, sf_mode, col_major, flavor)
PBC_CASES = [
    ("fp32", "e2m1", (32, 32), "fp32", False, "cuda"),
    ("bf16", "e4m3", (128, 32), "packed", True, "ascend"),
]


@pytest.mark.parametrize("case", PBC_CASES, ids=lambda c: "-".join(map(str, c)))
def test_per_block_cast(case):
    in_dtype, fmt, block, sf_mode, col_major, flavor = case
    options = _options(sf_mode, col_major)
    del options["use_e4m3_sf"]
    x = nonfinite_input(PBC_SHAPE, DTYPES[in_dtype], block, seed=block[0])
    got = per_block_cast(x, fmt, block, target="cpu", flavor=flavor, **options)
    expected = per_block_cast(x, fmt, block, target="torch", flavor=flavor, **options)
    label = "-".join(map(str, case))
    _assert_same(got, expected, label)
    assert_policy(x, *got, fmt, sf_mode, block, flavor, label)


def test_per_block_cast_with_sf_only():
    block, fmt = (32, 128), "e4m3"
    options = _options("pow2")
    del options["use_e4m3_sf"]
    x = nonfinite_input(PBC_SHAPE, torch.float32, block, seed=7)
    sf = per_block_cast_with_sf_only(x, fmt, block, target="cpu", flavor="ascend", **options)
    _, expected = per_block_cast(x, fmt, block, target="torch", flavor="ascend", **options)
    assert_bitwise_equal(sf, expected, "per_block sf_only")
    assert_policy(x, None, sf, fmt, "pow2", block, "ascend", "per_block sf_only")


def test_per_block_cast_with_precomputed_sf():
    block, fmt = (32, 32), "e4m3"
    x = randn(PBC_SHAPE, 13).to(torch.bfloat16)
    x[::3, ::4] = 0.0
    x[1::8, 5::9] = float("nan")
    x[2::8, 6::11] = float("inf")
    _, sf = per_block_cast(x, fmt, block, target="torch")
    bits = sf.view(torch.int32)
    specials = (0x7FC00000, 0x7F800000, 0, 0x80000000, 0xFF800000, 0xFFC12345)
    for i in range(0, sf.shape[0], 2):
        for j in range(i % 3, sf.shape[1], 3):
            bits[i, j] = _signed(specials[(i + j) % len(specials)], 32)
    got = per_block_cast_with_precomputed_sf(x, fmt, block, sf, target="cpu", flavor="cuda")
    expected = per_block_cast_with_precomputed_sf(x, fmt, block, sf, target="torch", flavor="cuda")
    assert_bitwise_equal(got, expected, "per_block precomputed")
    assert_canonical_nans(got, "per_block precomputed")


# --- per_token_cast_and_cast_back -------------------------------------------------------------

# (in_dtype, fmt, num_per_channels, sf_mode, flavor)
PTCCB_CASES = [
    ("fp32", "e4m3", 32, "fp32", "ascend"),
    ("bf16", "e2m1", 16, "e4m3", "cuda"),
    ("bf16", "e4m3", 64, "pow2", "ascend"),
]


def _check_cast_and_cast_back(case, target):
    in_dtype, fmt, npc, sf_mode, flavor = case
    round_sf, _, use_e4m3_sf = SF_MODES[sf_mode]
    x = nonfinite_input(PTC_SHAPE, DTYPES[in_dtype], (1, npc), seed=npc + 1)
    got = x.clone()
    per_token_cast_and_cast_back(got, fmt, npc, round_sf=round_sf, use_e4m3_sf=use_e4m3_sf, target=target,
                                 flavor=None if target == "ascend-sim" else flavor)
    expected = x.clone()
    per_token_cast_and_cast_back(expected, fmt, npc, round_sf=round_sf, use_e4m3_sf=use_e4m3_sf, target="torch",
                                 flavor=flavor)
    label = "-".join(map(str, case)) + f" target={target}"
    assert_bitwise_equal(got, expected, label)
    assert_canonical_nans(got, label)
    # The policy: a NaN group comes back all NaN unless the SF is a power of two (sf 0.0: ±0
    # and, for E4M3, NaN where x is 0 or NaN); with an fp32 or power-of-two SF an inf group
    # (sf inf) comes back NaN except at its infinities (E2M1 +6 · inf = inf).
    xf, back = x.float(), got.float()
    nan_groups = _group_any(torch.isnan(xf), (1, npc))
    inf_groups = _group_any(torch.isinf(xf), (1, npc)) & ~nan_groups
    assert bool(nan_groups.any()) and bool(inf_groups.any())
    if sf_mode == "pow2":
        zero_or_nan = (xf == 0) | torch.isnan(xf)
        expected_nan = zero_or_nan if fmt == "e4m3" else torch.zeros_like(zero_or_nan)
        assert torch.equal(torch.isnan(back[nan_groups]), expected_nan[nan_groups]), label
        assert bool((back[nan_groups & ~expected_nan] == 0).all()), label
    else:
        assert bool(torch.isnan(back[nan_groups]).all()), label
    if sf_mode != "e4m3":
        pick = inf_groups & (~torch.isinf(xf) if fmt == "e2m1" else torch.ones_like(inf_groups))
        assert bool(torch.isnan(back[pick]).all()), label


@pytest.mark.parametrize("case", PTCCB_CASES, ids=lambda c: "-".join(map(str, c)))
def test_per_token_cast_and_cast_back(case):
    _check_cast_and_cast_back(case, "cpu")


# --- per_channel_cast -------------------------------------------------------------------------

PCC_SHAPE = (256, 384)
# (in_dtype, num_per_tokens, sf_mode, flavor): the kernels of pcc_cases.COVERING[0], [2] and [1].
PCC_CASES = [("bf16", 32, "fp32", "ascend"), ("fp32", 128, "packed", "ascend")]


def _check_per_channel_cast(case, target):
    in_dtype, npt, sf_mode, flavor = case
    options = _options(sf_mode)
    del options["use_e4m3_sf"], options["use_tma_aligned_col_major_sf"]
    x = nonfinite_input(PCC_SHAPE, DTYPES[in_dtype], (npt, 1), seed=npt)
    label = "-".join(map(str, case)) + f" target={target}"
    got = per_channel_cast(x, "e4m3", npt, target=target, flavor=None if target == "ascend-sim" else flavor,
                           **options)
    expected = per_channel_cast(x, "e4m3", npt, target="torch", flavor=flavor, **options)
    _assert_same(got, expected, label)
    assert_policy(x, *got, "e4m3", sf_mode, (npt, 1), flavor, label)


@pytest.mark.parametrize("case", PCC_CASES, ids=lambda c: "-".join(map(str, c)))
def test_per_channel_cast(case):
    _check_per_channel_cast(case, "cpu")


def test_per_channel_cast_quantized_input():
    # An fp32 input SF holding NaN, ±inf and 0, and E4M3 NaN codes in the data: the dequantized
    # value q · s_in carries them (the kernel of pcc_cases.COVERING[5]).
    npc, npt, flavor = 128, 128, "cuda"
    data, sf_in = reference.cast(randn(PCC_SHAPE, 12), "e4m3", (1, npc), round_sf=True, flavor=flavor)
    specials = (0x7FC00000, 0x7F800000, 0xFF800000, 0, 0xFFC12345)
    sf_bits = sf_in.view(torch.int32)
    for i in range(0, sf_in.shape[0], 5):
        sf_bits[i, i % sf_in.shape[1]] = _signed(specials[i % len(specials)], 32)
    data.view(torch.uint8)[5::37, 7::19] = 0xFF
    data.view(torch.uint8)[2::41, 40::33] = 0x7F
    x = (data, sf_in)
    got = per_channel_cast(x, "e4m3", npt, num_per_channels=npc, target="cpu", flavor=flavor)
    expected = per_channel_cast(x, "e4m3", npt, num_per_channels=npc, target="torch", flavor=flavor)
    _assert_same(got, expected, "per_channel_cast quantized")
    dequantized = reference.cast_back(x, "fp32", (1, npc), flavor=flavor)
    assert_policy(dequantized, *got, "e4m3", "fp32", (npt, 1), flavor, "per_channel_cast quantized")


# --- ascend-sim: the emitted AscendC on the CPU model (ascend flavor) --------------------------

@pytest.mark.slow
def test_ascend_sim_per_token_cast():
    # round_sf with UE8M0 bytes, E2M1 codes and a partial last group.
    _check_per_token_cast(("fp32", "e2m1", 128, "packed", True, "ascend"), "ascend-sim")


@pytest.mark.slow
def test_ascend_sim_per_channel_cast():
    # Power-of-two fp32 SF (0.0 for NaN blocks, inf for inf blocks) stored by DMA.
    _check_per_channel_cast(("bf16", 128, "pow2", "ascend"), "ascend-sim")


@pytest.mark.slow
def test_ascend_sim_per_token_cast_and_cast_back():
    # fp32 SF (store_scale_value), E4M3 codes, canonical bf16 NaN on the way back.
    _check_cast_and_cast_back(("bf16", "e4m3", 32, "fp32", "ascend"), "ascend-sim")


# --- per_block_cast_lossless: an fp32 input SF must be a normal power of two -------------------

def _lossless_input():
    return reference.cast(randn((128, 256), 17), "e2m1", (1, 32), round_sf=True)


BAD_SF = [(0.75, "not a power of two"), (3.0, "not a power of two"), (-0.5, "negative"), (-0.0, "negative"),
          (0.0, "zero"), (float("inf"), "infinite"), (float("nan"), "NaN"), (2.0**-130, "subnormal")]


@pytest.mark.parametrize("target", ["cpu", "torch"])
def test_lossless_fp32_sf_must_be_a_normal_power_of_two(target, monkeypatch):
    data, sf = _lossless_input()
    # Every normal power of two passes, and is re-quantized exactly (2^-126 .. 2^-121 pass too,
    # but an output block of only those gets E_out = 0, an sf of 0.0).
    good = sf.clone()
    good[:, 0] = torch.exp2(torch.linspace(-120, 127, 128).round())
    good[:, 1:] = good[:, :1]  # one binade per output block row
    out = per_block_cast_lossless((data, good), "e4m3", (1, 32), (1, 128), round_sf=True, target=target)
    assert_bitwise_equal(reference.cast_back(out, "fp32", (1, 128)), reference.cast_back((data, good), "fp32", (1, 32)),
                         "lossless over the whole exponent range")

    forbid_kernels(monkeypatch, "vmi_quant.kernels.per_block_cast_lossless", why="bad input")
    for value, reason in BAD_SF:
        bad = sf.clone()
        bad[70, 5] = value
        with pytest.raises(ValueError, match=rf"x sf \(float32\) must hold positive normal powers of two.*"
                                             rf"x sf\[70, 5\] = .* is {reason}"):
            per_block_cast_lossless((data, bad), "e4m3", (1, 32), (32, 32), round_sf=True, target=target)
        # Column-major: the index is the logical one.
        with pytest.raises(ValueError, match=r"x sf\[70, 5\]"):
            per_block_cast_lossless((data, bad.t().contiguous().t()), "e4m3", (1, 32), (32, 32), round_sf=True,
                                    target=target)
