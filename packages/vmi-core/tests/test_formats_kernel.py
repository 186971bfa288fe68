"""The number-format kernel macros (vmi_core.tl.formats) on the CPU target, bit for bit.

One kernel maps fp32 values, byte codes and bf16 patterns through every macro; its
outputs are compared with the torch twins (vmi_core.formats), with torch's own casts
where torch has them, and with the spec tables (quant-a §1.4). A second kernel stores
``f32_const`` constants, which must survive the C code generator's literal printing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tilelang.language as T
import torch

from vmi_core import formats as tw
from vmi_core.compile import compile_kernel
from vmi_core.tl import formats as F
from vmi_core.tools.testing import assert_bitwise_equal, bits

N = 1 << 17  # >= 2 * 65536: every bf16 pattern plus room for the fp32 inputs
BLOCK = 1024
U32 = 0xFFFFFFFF


def build_formats_kernel(n: int = N, block: int = BLOCK):
    """Every format macro, one output each (element-wise over GM, one loop per macro).

    uint32 results travel as int32: TileLang's CPU wrapper has no uint32 argument type.
    """

    @T.prim_func
    def formats_kernel(
        X: T.Tensor((n,), "float32"), C: T.Tensor((n,), "uint8"), H: T.Tensor((n,), "uint16"),
        E4: T.Tensor((n,), "uint8"), E4D: T.Tensor((n,), "float32"),
        E2: T.Tensor((n,), "uint8"), E2D: T.Tensor((n,), "float32"),
        PK: T.Tensor((n // 2,), "uint8"), UP: T.Tensor((n,), "uint8"),
        BF: T.Tensor((n,), "uint16"), BFD: T.Tensor((n,), "float32"),
        UC: T.Tensor((n,), "int32"), UD: T.Tensor((n,), "float32"), P2: T.Tensor((n,), "float32"),
        AB: T.Tensor((n,), "int32"),
    ):
        with T.Kernel(n // block) as bx:
            for i in T.Parallel(block):
                E4[bx * block + i] = F.f32_to_e4m3(X[bx * block + i])
            for i in T.Parallel(block):
                E4D[bx * block + i] = F.e4m3_to_f32(C[bx * block + i])
            for i in T.Parallel(block):
                E2[bx * block + i] = T.Cast("uint8", F.f32_to_e2m1(X[bx * block + i]))
            for i in T.Parallel(block):
                E2D[bx * block + i] = F.e2m1_to_f32(C[bx * block + i] & T.uint8(0xF))
            for i in T.Parallel(block // 2):
                PK[bx * (block // 2) + i] = F.e2m1_pack(F.f32_to_e2m1(X[bx * block + 2 * i]),
                                                        F.f32_to_e2m1(X[bx * block + 2 * i + 1]))
            for i in T.Parallel(block):
                UP[bx * block + i] = T.Cast("uint8", F.e2m1_unpack(C[(bx * block + i) // 2], i % 2))
            for i in T.Parallel(block):
                BF[bx * block + i] = F.f32_to_bf16(X[bx * block + i])
            for i in T.Parallel(block):
                BFD[bx * block + i] = F.bf16_to_f32(H[bx * block + i])
            for i in T.Parallel(block):
                UC[bx * block + i] = T.Cast("int32", F.ue8m0_ceil(X[bx * block + i]))
            for i in T.Parallel(block):
                UD[bx * block + i] = F.ue8m0_to_f32(C[bx * block + i])
            for i in T.Parallel(block):
                P2[bx * block + i] = F.pow2_from_exponent(T.Cast("uint32", C[bx * block + i]))
            for i in T.Parallel(block):
                AB[bx * block + i] = T.Cast("int32", F.abs_bits(X[bx * block + i]))

    return formats_kernel


# --- inputs -----------------------------------------------------------------------------------

def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.float32)


def from_bits(patterns) -> torch.Tensor:
    return tw.f32_from_bits(torch.tensor(patterns, dtype=torch.int64))


def neighbours(x: torch.Tensor) -> torch.Tensor:
    """``x`` and its fp32 neighbours on both sides (same sign)."""
    b = tw.f32_bits(x)
    return torch.cat([x, tw.f32_from_bits(b + 1), tw.f32_from_bits((b - 1).clamp(min=0) | (b & 0x80000000))])


def signed(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, -x])


def random_binades(n: int, seed: int) -> torch.Tensor:
    """sign * [1, 2) * 2^e for e over every binade (fp32 subnormals and overflow to inf included)."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(n, generator=g, dtype=torch.float64) + 1.0
    exp = torch.randint(-152, 129, (n,), generator=g).to(torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (sign * mant * torch.exp2(exp)).to(torch.float32)


def random_patterns(n: int, seed: int) -> torch.Tensor:
    """Uniform random fp32 bit patterns (NaNs with payloads, subnormals, everything)."""
    g = torch.Generator().manual_seed(seed)
    return tw.f32_from_bits(torch.randint(0, 1 << 32, (n,), generator=g, dtype=torch.int64))


E4M3_VALUES = tw.e4m3_decode(torch.arange(0x7F, dtype=torch.uint8))  # 0 .. 448, ascending
E2M1_VALUES = tw.e2m1_decode(torch.arange(8, dtype=torch.uint8))  # 0 .. 6


def e4m3_ties() -> torch.Tensor:
    """Every midpoint between adjacent E4M3 magnitudes (subnormal and normal), and 464."""
    v = E4M3_VALUES.double()
    return torch.cat([((v[:-1] + v[1:]) / 2).float(), f32([464.0])])


def e2m1_ties() -> torch.Tensor:
    v = E2M1_VALUES.double()
    return ((v[:-1] + v[1:]) / 2).float()  # 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0


def bf16_ties(seed: int) -> torch.Tensor:
    """fp32 values exactly halfway between two bf16 values: random high halves (normal,
    subnormal, largest finite) with the low half 0x8000."""
    g = torch.Generator().manual_seed(seed)
    hi = torch.cat([torch.randint(0, 0x7F80, (2000,), generator=g), torch.arange(0, 0x100),
                    torch.tensor([0x7F7F, 0x7F7E, 0x0000, 0x0001, 0x007F, 0x0080])])
    return tw.f32_from_bits((hi << 16) | 0x8000)


SPECIAL_BITS = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # ±0, ±inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC12345,  # NaNs
    0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000, 0x00800000, 0x80800000,  # fp32 subnormals
    0x7F7FFFFF, 0xFF7FFFFF,  # ±FLT_MAX
]

SATURATION = [447.0, 448.0, 455.99997, 456.0, 456.00003, 463.99997, 464.0, 464.00003, 479.99997, 480.0,
              480.00003, 496.0, 500.0, 512.0, 1e6, 3.0e38]
E2M1_EDGES = [4.9999995, 5.0, 5.0000005, 5.0001, 5.9999995, 6.0, 6.0000005, 7.0, 1e10]
E4M3_SUBNORMAL_EDGES = [2.0**-10, 2.0**-9, 1.5 * 2.0**-10, 2.0**-6, 2.0**-6 * (1 - 2.0**-24), 0.875 * 2.0**-6,
                        0.9375 * 2.0**-6, 2.0**-11, 2.0**-12, 1e-20]

# Spec examples (quant-a §1.4): E4M3 and the E2M1 table.
EXAMPLES = [371.2, -371.2, -1e-20, 0.25000003, 0.7499999, 5.0001, -0.1, -5.0, 1.0000001, 0.75, 2.0**127]


def fp32_inputs() -> torch.Tensor:
    parts = [
        random_binades(40000, 1),
        random_patterns(20000, 2),
        signed(neighbours(e4m3_ties())),
        signed(neighbours(e2m1_ties())),
        signed(bf16_ties(3)), signed(neighbours(bf16_ties(4)[:500])),
        signed(neighbours(f32(SATURATION + E2M1_EDGES + E4M3_SUBNORMAL_EDGES))),
        signed(E4M3_VALUES), signed(E2M1_VALUES),
        from_bits(SPECIAL_BITS),
        f32(EXAMPLES),
    ]
    x = torch.cat(parts)
    assert x.numel() <= N
    return torch.cat([x, random_binades(N - x.numel(), 5)])


@pytest.fixture(scope="module")
def run():
    """Outputs of the formats kernel on ``fp32_inputs()``, all byte codes and all bf16 patterns."""
    kernel = compile_kernel(build_formats_kernel(), "cpu")
    g = torch.Generator().manual_seed(6)
    x = fp32_inputs()
    c = torch.cat([torch.arange(256), torch.randint(0, 256, (N - 256,), generator=g)]).to(torch.uint8)
    h = torch.cat([torch.arange(65536), torch.randint(0, 65536, (N - 65536,), generator=g)]).to(torch.int32)
    h = h.to(torch.uint16)
    u8, u16, i32 = torch.uint8, torch.uint16, torch.int32
    out = {
        "e4": torch.empty(N, dtype=u8), "e4d": torch.empty(N), "e2": torch.empty(N, dtype=u8),
        "e2d": torch.empty(N), "pk": torch.empty(N // 2, dtype=u8), "up": torch.empty(N, dtype=u8),
        "bf": torch.empty(N, dtype=u16), "bfd": torch.empty(N), "uc": torch.empty(N, dtype=i32),
        "ud": torch.empty(N), "p2": torch.empty(N), "ab": torch.empty(N, dtype=i32),
    }
    kernel(x, c, h, *out.values())
    return x, c, h, out


def u32(t: torch.Tensor) -> torch.Tensor:
    """uint32 values held in an int32 tensor (the CPU wrapper has no uint32 arguments), as int64."""
    return t.to(torch.int64) & U32


def assert_nan_sign_equal(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Same NaN-ness everywhere and, where both are NaN, the same sign bit."""
    assert torch.equal(actual.isnan(), expected.isnan()), f"{name}: NaN positions differ"
    nan = expected.isnan()
    assert torch.equal(actual[nan].signbit(), expected[nan].signbit()), f"{name}: NaN signs differ"


# --- fp8 e4m3 ---------------------------------------------------------------------------------

class TestE4m3:
    def test_encode_matches_twin(self, run):
        x, _, _, out = run
        assert_bitwise_equal(out["e4"], tw.e4m3_encode(x), "f32_to_e4m3 vs e4m3_encode")

    def test_encode_matches_torch(self, run):
        x, _, _, out = run
        ref = x.clamp(-448, 448).to(torch.float8_e4m3fn)
        got = out["e4"].view(torch.float8_e4m3fn)
        nan = x.isnan()
        assert_bitwise_equal(got[~nan], ref[~nan], "f32_to_e4m3 vs torch (non-NaN)")
        # NaN: the E4M3 NaN code (S.1111.111) with the input's sign, as torch.
        assert bool(((out["e4"][nan] & 0x7F) == 0x7F).all())
        assert_nan_sign_equal(got.float(), ref.float(), "f32_to_e4m3 NaN")

    def test_ties_round_to_even(self, run):
        x, _, _, out = run
        # Midpoint k lies between codes k and k + 1: it must take the even one.
        ties = e4m3_ties()[:-1]  # 464 saturates
        k = torch.arange(ties.numel())
        expected = (k + k % 2).to(torch.uint8)
        assert torch.equal(kernel_values(x, out["e4"], ties), expected)
        assert torch.equal(kernel_values(x, out["e4"], -ties), expected | 0x80)
        # Just off a midpoint, the nearest code wins.
        below = tw.f32_from_bits(tw.f32_bits(ties[1:]) - 1)
        above = tw.f32_from_bits(tw.f32_bits(ties[1:]) + 1)
        assert torch.equal(kernel_values(x, out["e4"], below), k[1:].to(torch.uint8))
        assert torch.equal(kernel_values(x, out["e4"], above), (k[1:] + 1).to(torch.uint8))

    def test_saturation_and_spec_example(self, run):
        x, _, _, out = run
        for value in SATURATION:
            hit = x == np.float32(value)
            assert bool((out["e4"][hit] == 0x7E).all()), value
            assert bool((out["e4"][x == -np.float32(value)] == 0xFE).all()), value
        for value, code in [(371.2, 0x7C), (-371.2, 0xFC), (-0.0, 0x80), (-1e-20, 0x80), (2.0**-9, 0x01),
                            (1.5 * 2.0**-10, 0x01), (2.0**-10, 0x00), (448.0, 0x7E), (math.inf, 0x7E),
                            (-math.inf, 0xFE)]:
            assert int(kernel_value(x, out["e4"], value)) == code, value

    def test_decode_all_codes(self, run):
        _, c, _, out = run
        got = out["e4d"][:256]
        assert_bitwise_equal(got, tw.e4m3_decode(c[:256]), "e4m3_to_f32 vs e4m3_decode")
        ref = c[:256].view(torch.float8_e4m3fn).float()
        nan = ref.isnan()
        assert int(nan.sum()) == 2
        assert_bitwise_equal(got[~nan], ref[~nan], "e4m3_to_f32 vs torch")
        assert_nan_sign_equal(got, ref, "e4m3_to_f32 NaN")
        assert_bitwise_equal(out["e4d"], tw.e4m3_decode(c), "e4m3_to_f32 (random codes)")


_sorted: dict = {}


def kernel_values(x: torch.Tensor, out: torch.Tensor, values) -> torch.Tensor:
    """The kernel outputs for the inputs bit-equal to fp32(``values``)."""
    if _sorted.get("x") is not x:
        order = torch.argsort(tw.f32_bits(x), stable=True)
        _sorted.update(x=x, order=order, bits=tw.f32_bits(x)[order])
    order, sorted_bits = _sorted["order"], _sorted["bits"]
    wanted = tw.f32_bits(values if isinstance(values, torch.Tensor) else f32(values))
    pos = torch.searchsorted(sorted_bits, wanted).clamp(max=x.numel() - 1)
    missing = sorted_bits[pos] != wanted
    assert not bool(missing.any()), f"inputs missing: {tw.f32_from_bits(wanted[missing]).tolist()}"
    return out[order[pos]]


def kernel_value(x: torch.Tensor, out: torch.Tensor, value: float) -> int:
    """The kernel output for the input bit-equal to fp32(``value``)."""
    return int(kernel_values(x, out, [value])[0])


# --- fp4 e2m1 ---------------------------------------------------------------------------------

E2M1_SPEC = [  # quant-a §1.4 table: input value -> code
    (0.25, 0), (0.25000003, 1), (0.75, 2), (0.7499999, 1), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6),
    (5.0, 6), (5.0001, 7), (6.0, 7), (7.0, 7), (math.inf, 7), (-math.inf, 15), (-0.0, 8), (-0.1, 8), (0.0, 0),
    (-5.0, 14), (1e10, 7),
]


class TestE2m1:
    def test_encode_matches_twin(self, run):
        x, _, _, out = run
        assert_bitwise_equal(out["e2"], tw.e2m1_encode(x), "f32_to_e2m1 vs e2m1_encode")

    def test_spec_table(self, run):
        x, _, _, out = run
        for value, code in E2M1_SPEC:
            assert kernel_value(x, out["e2"], value) == code, value

    def test_nan_saturates_with_sign(self, run):
        x, _, _, out = run
        nan = x.isnan()
        expected = torch.where(x[nan].signbit(), 15, 7).to(torch.uint8)
        assert torch.equal(out["e2"][nan], expected)

    def test_ties_to_even_code(self, run):
        x, _, _, out = run
        for tie in e2m1_ties().tolist():
            code = kernel_value(x, out["e2"], tie)
            assert code % 2 == 0, tie

    def test_decode_all_codes(self, run):
        _, c, _, out = run
        got = out["e2d"][:16]
        assert_bitwise_equal(got, tw.e2m1_decode(c[:16]), "e2m1_to_f32 vs e2m1_decode")
        table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
        assert_bitwise_equal(got, f32(table + [-v for v in table]), "e2m1_to_f32 vs spec table")
        assert_bitwise_equal(out["e2d"], tw.e2m1_decode(c & 0xF), "e2m1_to_f32 (random codes)")

    def test_pack_unpack(self, run):
        x, c, _, out = run
        assert_bitwise_equal(out["pk"].view(torch.int8), tw.e2m1_pack(tw.e2m1_encode(x)), "e2m1_pack")
        assert_bitwise_equal(out["up"], tw.e2m1_unpack(c[: N // 2]), "e2m1_unpack")
        # Element 2j in the low nibble.
        assert int(out["up"][0]) == int(c[0]) & 0xF and int(out["up"][1]) == int(c[0]) >> 4


# --- bf16 -------------------------------------------------------------------------------------

class TestBf16:
    def test_encode_matches_twin(self, run):
        x, _, _, out = run
        assert_bitwise_equal(out["bf"].view(torch.int16), tw.bf16_encode(x), "f32_to_bf16 vs bf16_encode")

    def test_encode_matches_torch(self, run):
        x, _, _, out = run
        got = out["bf"].view(torch.bfloat16)
        ref = x.to(torch.bfloat16)
        nan = x.isnan()
        assert_bitwise_equal(got[~nan], ref[~nan], "f32_to_bf16 vs torch (non-NaN)")
        assert bool(got[nan].isnan().all())
        # torch canonicalises NaN to 0x7FC0; the macro keeps the sign and the high payload, quieted.
        assert torch.equal(got[nan].signbit(), x[nan].signbit())
        assert torch.equal(bits(got[nan]).to(torch.int64) & 0x7FBF, (tw.f32_bits(x[nan]) >> 16) & 0x7FBF)

    def test_ties(self, run):
        x, _, _, out = run
        ties = bf16_ties(3)
        idx = torch.isin(tw.f32_bits(x), tw.f32_bits(ties))
        assert int(idx.sum()) >= ties.unique().numel()
        low_bit = out["bf"][idx].to(torch.int32) & 1
        assert bool((low_bit == 0).all()), "a bf16 tie did not round to even"
        max_finite_tie = float(from_bits([0x7F7F8000])[0])
        assert kernel_value(x, out["bf"], max_finite_tie) == 0x7F80  # rounds to even: inf

    def test_decode_all_patterns(self, run):
        _, _, h, out = run
        got = out["bfd"][:65536]
        assert_bitwise_equal(got, tw.bf16_decode(h[:65536]), "bf16_to_f32 vs bf16_decode")
        assert_bitwise_equal(got, h[:65536].view(torch.bfloat16).float(), "bf16_to_f32 vs torch")


# --- ue8m0, pow2, abs -------------------------------------------------------------------------

class TestUe8m0:
    def test_ceil_matches_twin(self, run):
        x, _, _, out = run
        # The macro's domain: positive t (normal; subnormal and inf agree as well).
        pos = (x > 0) & ~x.isnan()
        assert int(pos.sum()) > 10000
        assert torch.equal(u32(out["uc"][pos]), tw.ue8m0_encode_ceil(x[pos]).to(torch.int64))

    def test_ceil_examples(self, run):
        x, _, _, out = run
        for value, exp in [(1.0, 127), (1.0000001, 128), (0.75, 127), (448.0, 136), (2.0**-126, 1),
                           (2.0**127, 254),
                           (3.0e38, 255), (math.inf, 255)]:
            assert kernel_value(x, out["uc"], value) == exp, value

    def test_decode_all_codes(self, run):
        _, c, _, out = run
        ref = tw.ue8m0_decode(c)
        assert_bitwise_equal(out["ud"], ref, "ue8m0_to_f32")
        assert_bitwise_equal(out["p2"], ref, "pow2_from_exponent")
        assert float(out["ud"][0]) == 0.0 and out["ud"][255] == math.inf
        powers = torch.exp2(torch.arange(1, 255, dtype=torch.float64) - 127)
        assert torch.equal(out["ud"][1:255].double(), powers)

    def test_abs_bits(self, run):
        x, _, _, out = run
        assert torch.equal(u32(out["ab"]), tw.f32_bits(x) & 0x7FFFFFFF)


# --- f32_const through the C backend ----------------------------------------------------------

CONSTS = [
    float(np.float32(1.0) / np.float32(448.0)), float(np.float32(1.0) / np.float32(6.0)), 6 * 2.0**-126,
    1e-4, 0.1, 1 / 3, math.pi, 0.8325546383857727, 2.0**-149, 3 * 2.0**-149, 2.0**-126, 1.1754942e-38, -2.5e-40,
    3.4028235e38, 448.0, 1.0, 0.0, -0.0, 123456.789, 16777217.0, 4.71802573883906e-4, -4.99999821e-1,
    math.inf, -math.inf,
]


def const_table(i, values):
    """``values[i]`` as a chain of selects on the index (each value an ``f32_const``)."""
    expr = F.f32_const(values[-1])
    for k in range(len(values) - 2, -1, -1):
        expr = T.Select(i == k, F.f32_const(values[k]), expr)
    return expr


def build_const_kernel(values):
    n = len(values)

    @T.prim_func
    def const_kernel(Y: T.Tensor((n,), "float32")):
        with T.Kernel(1):
            for i in T.Parallel(n):
                Y[i] = const_table(i, values)

    return const_kernel


def test_f32_const_round_trips_through_c():
    y = torch.empty(len(CONSTS))
    compile_kernel(build_const_kernel(CONSTS), "cpu")(y)
    expected = torch.tensor(np.array(CONSTS, dtype=np.float32))
    assert_bitwise_equal(y, expected, "f32_const")
    assert int(tw.f32_bits(y[0:1])[0]) == 0x3B124925  # fl32(1/448), spec §1.6
    assert int(tw.f32_bits(y[1:2])[0]) == 0x3E2AAAAB  # fl32(1/6)
    assert int(tw.f32_bits(y[2:3])[0]) == 0x01C00000  # 6 * 2^-126


def test_f32_const_nan():
    y = torch.empty(2)
    compile_kernel(build_const_kernel([math.nan, 1.0]), "cpu")(y)
    assert int(tw.f32_bits(y[:1])[0]) == int(np.float32(math.nan).view(np.uint32))


# --- exhaustive sweep -------------------------------------------------------------------------

SWEEP_LOW_HALVES = (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF)


@pytest.mark.slow
def test_encoders_every_high_half():
    """Every fp32 high half (sign, exponent, top 7 mantissa bits) with six low halves: every bf16,
    E4M3 and E2M1 rounding midpoint and its neighbours, every binade, every NaN class."""
    n = len(SWEEP_LOW_HALVES) << 16
    kernel = compile_kernel(build_formats_kernel(n), "cpu")
    hi = torch.arange(1 << 16, dtype=torch.int64) << 16
    x = tw.f32_from_bits(torch.cat([hi | low for low in SWEEP_LOW_HALVES]))
    c = torch.zeros(n, dtype=torch.uint8)
    h = torch.zeros(n, dtype=torch.uint16)
    u8, u16, i32 = torch.uint8, torch.uint16, torch.int32
    out = [torch.empty(n, dtype=u8), torch.empty(n), torch.empty(n, dtype=u8), torch.empty(n),
           torch.empty(n // 2, dtype=u8), torch.empty(n, dtype=u8), torch.empty(n, dtype=u16), torch.empty(n),
           torch.empty(n, dtype=i32), torch.empty(n), torch.empty(n), torch.empty(n, dtype=i32)]
    kernel(x, c, h, *out)
    e4, _, e2, _, pk, _, bf, _, uc, _, _, ab = out
    assert_bitwise_equal(e4, tw.e4m3_encode(x), "f32_to_e4m3 sweep")
    nan = x.isnan()
    assert_bitwise_equal(e4.view(torch.float8_e4m3fn)[~nan], x[~nan].clamp(-448, 448).to(torch.float8_e4m3fn),
                         "f32_to_e4m3 vs torch sweep")
    assert_bitwise_equal(e2, tw.e2m1_encode(x), "f32_to_e2m1 sweep")
    assert_bitwise_equal(pk.view(torch.int8), tw.e2m1_pack(tw.e2m1_encode(x)), "e2m1_pack sweep")
    assert_bitwise_equal(bf.view(torch.int16), tw.bf16_encode(x), "f32_to_bf16 sweep")
    assert_bitwise_equal(bf.view(torch.bfloat16)[~nan], x[~nan].to(torch.bfloat16),
                         "f32_to_bf16 vs torch sweep")
    pos = (x > 0) & ~nan
    assert torch.equal(u32(uc[pos]), tw.ue8m0_encode_ceil(x[pos]).to(torch.int64))
    assert torch.equal(u32(ab), tw.f32_bits(x) & 0x7FFFFFFF)
