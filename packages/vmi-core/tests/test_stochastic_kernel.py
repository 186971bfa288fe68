"""The stochastic-rounding kernel macros (vmi_core.tl.stochastic) on the CPU target, bit for bit
against the torch twins of vmi_core.stochastic (quant-a §1.10).

One kernel hashes quads (``sr_mix``), derives the per-element 16-bit numbers
(``sr_random16``), rounds with given numbers (``stochastic_round``, three formats) and
runs the fused path an op uses (hash -> random16 -> round -> RNE encoder).
"""

# No ``from __future__ import annotations`` here: TileLang evaluates a prim_func's signature
# from the builder's closure, which only holds the sizes that the body itself uses.

import math

import pytest
import tilelang.language as T
import torch

from vmi_core import formats as tw
from vmi_core.compile import compile_kernel
from vmi_core.stochastic import random16, sr_hash, stochastic_round
from vmi_core.tl import formats as F
from vmi_core.tl.stochastic import SR_FORMATS, sr_mix, sr_random16
from vmi_core.tl.stochastic import stochastic_round as sr_macro
from vmi_core.tools.testing import assert_bitwise_equal

N = 1 << 15
QUADS = N // 4
BLOCK_Q = 256  # quads per block
U32 = 0xFFFFFFFF
FMTS = ("bf16", "e4m3", "e2m1")
QMAX = {"e4m3": 448.0, "e2m1": 6.0}


def _bits_at(X, k):
    return F.f32_bits(X[k])


def _sr_at(X, R, k, fmt: str):
    """``X[k]`` rounded stochastically onto ``fmt`` with the random number ``R[k]`` (int32 holding uint16)."""
    return sr_macro(X[k], T.Cast("uint32", R[k]), fmt)


def build_sr_kernel(n: int = N, block_q: int = BLOCK_Q):
    """uint32 values travel as int32 (TileLang's CPU wrapper has no uint32 argument type)."""
    q = n // 4

    @T.prim_func
    def sr_kernel(
        X: T.Tensor((n,), "float32"), CNT: T.Tensor((q,), "int32"), RIN: T.Tensor((n,), "int32"),
        HASH: T.Tensor((q,), "int32"), R16: T.Tensor((n,), "int32"),
        SB: T.Tensor((n,), "float32"), SE: T.Tensor((n,), "float32"), S2: T.Tensor((n,), "float32"),
        QB: T.Tensor((n,), "uint16"), QE: T.Tensor((n,), "uint8"), Q2: T.Tensor((n,), "uint8"),
    ):
        with T.Kernel(q // block_q) as bx:
            for i in T.Parallel(block_q):
                h = T.alloc_var("uint32")
                h = sr_mix(_bits_at(X, 4 * (bx * block_q + i)), _bits_at(X, 4 * (bx * block_q + i) + 1),
                           _bits_at(X, 4 * (bx * block_q + i) + 2), _bits_at(X, 4 * (bx * block_q + i) + 3),
                           T.Cast("uint32", CNT[bx * block_q + i]))
                HASH[bx * block_q + i] = T.Cast("int32", h)
                R16[4 * (bx * block_q + i)] = T.Cast("int32", sr_random16(h, 0))
                R16[4 * (bx * block_q + i) + 1] = T.Cast("int32", sr_random16(h, 1))
                R16[4 * (bx * block_q + i) + 2] = T.Cast("int32", sr_random16(h, 2))
                R16[4 * (bx * block_q + i) + 3] = T.Cast("int32", sr_random16(h, 3))
            for j in T.Parallel(4 * block_q):
                SB[4 * bx * block_q + j] = _sr_at(X, RIN, 4 * bx * block_q + j, "bf16")
            for j in T.Parallel(4 * block_q):
                SE[4 * bx * block_q + j] = _sr_at(X, RIN, 4 * bx * block_q + j, "e4m3")
            for j in T.Parallel(4 * block_q):
                S2[4 * bx * block_q + j] = _sr_at(X, RIN, 4 * bx * block_q + j, "e2m1")
            # The fused path of an op: the kernel's own random numbers, then the RNE encoders.
            for j in T.Parallel(4 * block_q):
                QB[4 * bx * block_q + j] = F.f32_to_bf16(_sr_at(X, R16, 4 * bx * block_q + j, "bf16"))
            for j in T.Parallel(4 * block_q):
                QE[4 * bx * block_q + j] = F.f32_to_e4m3(_sr_at(X, R16, 4 * bx * block_q + j, "e4m3"))
            for j in T.Parallel(4 * block_q):
                Q2[4 * bx * block_q + j] = T.Cast("uint8",
                                                  F.f32_to_e2m1(_sr_at(X, R16, 4 * bx * block_q + j, "e2m1")))

    return sr_kernel


# --- inputs -----------------------------------------------------------------------------------

def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


def grid(fmt: str) -> torch.Tensor:
    """Finite non-negative values of ``fmt`` (fp32)."""
    if fmt == "bf16":
        return tw.bf16_decode(torch.arange(0x7F80))
    if fmt == "e4m3":
        return tw.e4m3_decode(torch.arange(0x7F, dtype=torch.uint8))
    return tw.e2m1_decode(torch.arange(8, dtype=torch.uint8))


def random_binades(n: int, seed: int, lo: int, hi: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(n, generator=g, dtype=torch.float64) + 1.0
    exp = torch.randint(lo, hi, (n,), generator=g).to(torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (sign * mant * torch.exp2(exp)).to(torch.float32)


SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 3.4028235e38, -3.4028235e38]
SATURATION = [440.0, 447.0, 447.99997, 448.0, 448.00003, 449.0, 464.0, 480.0, 1e6,  # e4m3
              5.0, 5.5, 5.9999995, 6.0, 6.0000005, 6.5, 1e3,  # e2m1
              3.3895314e38, 3.3961775e38, 3.40282e38]  # bf16 max finite 0x7F7F0000 and above
TINY = [2.0**-7, 2.0**-9, 2.0**-10, 2.0**-12, 3 * 2.0**-13, 2.0**-20, 2.0**-30,  # below E4M3's normals
        0.25, 0.3, 0.75, 0.9999999, 2.0**-3,  # below E2M1's normals
        2.0**-126, 2.0**-127, 2.0**-133, 3 * 2.0**-140, 2.0**-149, 1.1754942e-38]  # fp32 subnormals


def sr_inputs() -> torch.Tensor:
    """Quads of random values over many binades, exact grid values, subnormal targets,
    saturation boundaries and specials (ragged parts padded with random values)."""
    special = f32(SPECIALS + SATURATION + TINY)
    parts = [
        random_binades(12000, 1, -150, 128),
        random_binades(8000, 2, -14, 10),  # around the E4M3/E2M1 ranges
        grid("e4m3"), -grid("e4m3"), grid("e2m1"), -grid("e2m1"), grid("bf16")[::7],
        special, -special,
        tw.f32_from_bits(torch.randint(1, 0x800000, (500,), generator=torch.Generator().manual_seed(3))),
    ]
    x = torch.cat(parts)
    assert x.numel() <= N
    return torch.cat([x, random_binades(N - x.numel(), 4, -20, 20)])


def counters() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    c = torch.randint(0, 1 << 32, (QUADS,), generator=g, dtype=torch.int64)
    c[:4] = torch.tensor([0, 1, 0xFFFFFFFF, 0x80000000])
    return c


def given_r16() -> torch.Tensor:
    """Uniform 16-bit numbers with the extremes 0 and 0xFFFF mixed in."""
    g = torch.Generator().manual_seed(6)
    r = torch.randint(0, 1 << 16, (N,), generator=g, dtype=torch.int64)
    pick = torch.rand(N, generator=g)
    return torch.where(pick < 0.05, 0, torch.where(pick > 0.95, 0xFFFF, r))


def to_i32(values: torch.Tensor) -> torch.Tensor:
    """uint32 values (int64) as the int32 with the same bits."""
    return (values - ((values >> 31) << 32)).to(torch.int32)


def u32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64) & U32


@pytest.fixture(scope="module")
def run():
    kernel = compile_kernel(build_sr_kernel(), "cpu")
    x, cnt, rin = sr_inputs(), counters(), given_r16()
    out = {"hash": torch.empty(QUADS, dtype=torch.int32), "r16": torch.empty(N, dtype=torch.int32),
           "bf16": torch.empty(N), "e4m3": torch.empty(N), "e2m1": torch.empty(N),
           "q_bf16": torch.empty(N, dtype=torch.uint16), "q_e4m3": torch.empty(N, dtype=torch.uint8),
           "q_e2m1": torch.empty(N, dtype=torch.uint8)}
    kernel(x, to_i32(cnt), to_i32(rin), *out.values())
    return x, cnt, rin, out


def mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & U32


def finish_hash(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r0, r1)`` from the quad hash ``h`` (§1.10, the steps after the mix)."""
    r0 = mul32(h, 0x846CA68B)
    r1 = mul32(h, 0xD35A2D97)
    return r0 ^ (r0 >> 11), r1 ^ (r1 >> 11)


# --- the hash ---------------------------------------------------------------------------------

def test_sr_mix_matches_sr_hash(run):
    x, cnt, _, out = run
    quads = tw.f32_bits(x).reshape(QUADS, 4)
    r0, r1 = sr_hash(quads[:, 0], quads[:, 1], quads[:, 2], quads[:, 3], cnt)
    k0, k1 = finish_hash(u32(out["hash"]))
    # h -> r0 is a bijection (odd multiplier, xorshift), so equal r0 means equal h.
    assert torch.equal(k0, r0)
    assert torch.equal(k1, r1)


def test_sr_random16_matches_random16(run):
    x, cnt, _, out = run
    expected = random16(x.reshape(1, N), cnt.reshape(1, QUADS)).reshape(N)
    assert torch.equal(u32(out["r16"]), expected)
    assert int(u32(out["r16"]).max()) <= 0xFFFF


def test_hash_python_integers(run):
    """A few quads against the §1.10 formula in Python integers (incl. counters 0 and 2^32 - 1)."""
    x, cnt, _, out = run
    xb = tw.f32_bits(x).tolist()
    for q in (0, 1, 2, 3, QUADS - 1):
        v = xb[4 * q:4 * q + 4]
        h = v[0] * 0x5671D42B + v[1] * 0x9995E499 + v[2] * 0xACE1B8A5 + v[3] * 0xE153538D + int(cnt[q])
        h &= U32
        h ^= h >> 23
        h = (h * 0x7FEB352D) & U32
        h ^= h >> 16
        assert int(u32(out["hash"][q])) == h


# --- rounding with given random numbers -------------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_stochastic_round_matches_twin(run, fmt):
    """fp32 results bit-exact wherever both define them as fp32: bf16 everywhere; E4M3/E2M1 below
    the saturation bound (at and above it the macro passes the input through and leaves the
    saturation to the encoder, while the twin saturates itself; see the encoded comparison)."""
    x, _, rin, out = run
    ref = stochastic_round(x, fmt, rin)
    if fmt == "bf16":
        assert_bitwise_equal(out[fmt], ref, "stochastic_round bf16")
        return
    below = x.abs() < QMAX[fmt]
    assert_bitwise_equal(out[fmt][below], ref[below], f"stochastic_round {fmt} (|x| < Q)")
    if fmt == "e4m3":
        nan = x.isnan()
        assert_bitwise_equal(out[fmt][nan], ref[nan], "stochastic_round e4m3 (NaN)")


@pytest.mark.parametrize("fmt", FMTS)
def test_stochastic_round_encoded_matches_twin(run, fmt):
    """After the RNE encoder, every input (saturation, inf, NaN included) gives the same code."""
    x, _, rin, out = run
    ref = stochastic_round(x, fmt, rin)
    if fmt == "bf16":
        assert_bitwise_equal(tw.bf16_encode(out[fmt]), tw.bf16_encode(ref), "SR bf16 encoded")
    elif fmt == "e4m3":
        assert_bitwise_equal(tw.e4m3_encode(out[fmt]), tw.e4m3_encode(ref), "SR e4m3 encoded")
    else:
        assert_bitwise_equal(tw.e2m1_encode(out[fmt]), tw.e2m1_encode(ref), "SR e2m1 encoded")


@pytest.mark.parametrize("fmt", FMTS)
def test_results_on_grid_and_adjacent(run, fmt):
    """Finite results below Q lie on the format's grid, at one of x's two neighbours."""
    x, _, _, out = run
    y = out[fmt]
    finite = x.isfinite() & (x.abs() < QMAX.get(fmt, math.inf))
    g = grid(fmt).double()
    if fmt == "bf16":
        finite &= x.abs() < 3.3895314e38  # the last step may round to inf
        g = torch.cat([g, torch.tensor([math.inf])])
    mag = x[finite].abs().double()
    ymag = y[finite].abs().double()
    hi = g[torch.searchsorted(g, mag, side="left")]
    lo = g[torch.searchsorted(g, mag, side="right") - 1]
    assert bool(((ymag == lo) | (ymag == hi)).all())
    assert torch.equal(y[finite].signbit(), x[finite].signbit())


@pytest.mark.parametrize("fmt", FMTS)
def test_grid_values_never_move(run, fmt):
    x, _, _, out = run
    on_grid = torch.isin(x.abs(), grid(fmt))
    assert int(on_grid.sum()) > 8
    assert_bitwise_equal(out[fmt][on_grid], x[on_grid], f"{fmt} grid values")


def test_bf16_is_the_ascend_rule(run):
    """bf16: bits = hi + (R < lo) on the fp32 pattern (§1.10), for every non-NaN input."""
    x, _, rin, out = run
    ok = ~x.isnan()
    b = tw.f32_bits(x[ok])
    expected = (b >> 16) + (rin[ok] < (b & 0xFFFF)).to(torch.int64)
    assert torch.equal(tw.f32_bits(out["bf16"][ok]), expected << 16)


def test_extreme_random_numbers(run):
    """R = 0 rounds every inexact value away from zero, R = 0xFFFF only those whose discarded
    bits exceed it (none, for bf16)."""
    x, _, rin, out = run
    inexact = x.isfinite() & (x.abs() < 400) & (x.abs() > 2.0**-6) & (tw.f32_bits(x) & 0xFFFF != 0)
    zero, full = inexact & (rin == 0), inexact & (rin == 0xFFFF)
    assert int(zero.sum()) > 50 and int(full.sum()) > 50
    assert bool((out["bf16"][zero].abs() > x[zero].abs()).all())
    assert bool((out["bf16"][full].abs() < x[full].abs()).all())


# --- the fused path ---------------------------------------------------------------------------

def test_fused_path_matches_twins(run):
    x, cnt, _, out = run
    r16 = random16(x.reshape(1, N), cnt.reshape(1, QUADS)).reshape(N)
    assert_bitwise_equal(out["q_bf16"].view(torch.int16), tw.bf16_encode(stochastic_round(x, "bf16", r16)),
                         "fused bf16")
    assert_bitwise_equal(out["q_e4m3"], tw.e4m3_encode(stochastic_round(x, "e4m3", r16)), "fused e4m3")
    assert_bitwise_equal(out["q_e2m1"], tw.e2m1_encode(stochastic_round(x, "e2m1", r16)), "fused e2m1")


def test_saturation_codes(run):
    x, _, _, out = run
    for value, e4, e2 in [(448.0, 0x7E, 7), (449.0, 0x7E, 7), (480.0, 0x7E, 7), (math.inf, 0x7E, 7),
                          (-math.inf, 0xFE, 15), (6.0, 0x4C, 7), (6.5, 0x4D, 7), (1e6, 0x7E, 7)]:
        idx = (tw.f32_bits(x) == int(tw.f32_bits(f32([value]))[0])).nonzero()[0, 0]
        assert int(out["q_e4m3"][idx]) == e4, value
        assert int(out["q_e2m1"][idx]) == e2, value
    nan = x.isnan()
    assert bool(((out["q_e4m3"][nan] & 0x7F) == 0x7F).all())
    assert torch.equal(out["q_e2m1"][nan], torch.where(x[nan].signbit(), 15, 7).to(torch.uint8))


def test_formats_table_matches_torch_side():
    """The kernel's format constants are the torch twin's (mantissa bits, minimum exponent, Q)."""
    from vmi_core.stochastic import _SR_FORMATS

    for fmt, (mant, emin, q_bits) in SR_FORMATS.items():
        t_mant, t_emin, t_q = _SR_FORMATS[fmt]
        assert (mant, emin) == (t_mant, t_emin)
        assert (q_bits is None) == (t_q is None)
        if q_bits is not None:
            assert int(tw.f32_bits(f32([t_q]))[0]) == q_bits
