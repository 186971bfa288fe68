"""vmi_core.formats against torch's own conversions, float64 math and the spec tables (§1.4, §1.6, §1.7)."""

from __future__ import annotations

import math

import pytest
import torch

from vmi_core.formats import (
    bf16_decode,
    bf16_encode,
    e2m1_decode,
    e2m1_encode,
    e2m1_pack,
    e2m1_unpack,
    e4m3_decode,
    e4m3_encode,
    f32_bits,
    f32_from_bits,
    ue8m0_decode,
    ue8m0_encode_ceil,
    ue8m0_pack,
    ue8m0_unpack,
)


def f32(bits: int) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)


def random_floats(n: int, seed: int, lo_exp: int = -140, hi_exp: int = 127) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(n, generator=g, dtype=torch.float64) + 1.0
    exp = torch.randint(lo_exp, hi_exp, (n,), generator=g).to(torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (sign * mant * torch.exp2(exp)).to(torch.float32)


def torch_e4m3_bits(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


SPECIALS = torch.tensor([0.0, -0.0, math.inf, -math.inf, 1.0, -1.0, 3.4028235e38, -3.4028235e38,
                         1.4e-45, -1.4e-45, 1.1754944e-38, 1.1754942e-38], dtype=torch.float32)


class TestBits:
    def test_f32_bits_round_trip(self):
        x = torch.cat([random_floats(1000, 0), SPECIALS])
        bits = f32_bits(x)
        assert bits.dtype == torch.int64
        assert int(bits.min()) >= 0 and int(bits.max()) <= 0xFFFFFFFF
        assert torch.equal(f32_from_bits(bits).view(torch.int32), x.view(torch.int32))
        assert int(f32_bits(torch.tensor([-0.0]))[0]) == 0x80000000
        assert torch.equal(f32_from_bits(x.view(torch.int32)).view(torch.int32), x.view(torch.int32))


class TestBf16:
    def test_encode_matches_torch(self):
        x = torch.cat([random_floats(200_000, 1), SPECIALS])
        expected = x.to(torch.bfloat16).view(torch.int16)
        assert torch.equal(bf16_encode(x), expected)

    def test_encode_ties(self):
        # Exact midpoints between bf16 neighbours: even one kept.
        assert int(bf16_encode(f32(0x3F808000))[0]) == 0x3F80
        assert int(bf16_encode(f32(0x3F818000))[0]) == 0x3F82
        assert int(bf16_encode(f32(0x7F7FFFFF))[0]) == 0x7F80  # overflow to inf

    def test_all_patterns_round_trip(self):
        patterns = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int64).to(torch.int16)
        values = bf16_decode(patterns)
        torch_values = patterns.view(torch.bfloat16).float()
        not_nan = ~torch_values.isnan()
        assert torch.equal(values.isnan(), ~not_nan)
        assert torch.equal(values[not_nan].view(torch.int32), torch_values[not_nan].view(torch.int32))
        encoded = bf16_encode(values)
        assert torch.equal(encoded[not_nan], patterns[not_nan])
        assert bf16_decode(encoded[~not_nan]).isnan().all()

    def test_decode_uint16(self):
        assert float(bf16_decode(torch.tensor([0xBF80], dtype=torch.int32).to(torch.uint16))[0]) == -1.0

    def test_nan_keeps_sign(self):
        nan = torch.tensor([math.nan, -math.nan])
        out = bf16_encode(nan)
        assert bf16_decode(out).isnan().all()
        assert ((out.to(torch.int64) >> 15) & 1).tolist() == (f32_bits(nan) >> 31).tolist()


E4M3_GRID = torch.arange(0, 0x7F, dtype=torch.int64).to(torch.uint8).view(torch.float8_e4m3fn).double()


class TestE4m3:
    def test_encode_matches_torch_random(self):
        x = torch.cat([random_floats(200_000, 2, lo_exp=-14, hi_exp=12), random_floats(20_000, 3), SPECIALS])
        assert torch.equal(e4m3_encode(x), torch_e4m3_bits(x))

    def test_encode_edges(self):
        grid = E4M3_GRID
        mids = ((grid[1:] + grid[:-1]) / 2).float()  # exact in fp32: ties
        up = torch.nextafter(mids, torch.full_like(mids, math.inf))
        down = torch.nextafter(mids, torch.zeros_like(mids))
        edges = torch.cat([grid.float(), mids, up, down, torch.tensor([448.0, 463.99997, 464.0, 479.0,
                                                                      480.0, 1e6, 2.0**-10, 2.0**-10 + 1e-9,
                                                                      3 * 2.0**-10, 2.0**-11])])
        edges = torch.cat([edges, -edges])
        assert torch.equal(e4m3_encode(edges), torch_e4m3_bits(edges))

    def test_saturation_and_specials(self):
        x = torch.tensor([math.inf, -math.inf, 500.0, -1e30, 0.0, -0.0, -1e-30, 371.2, -371.2])
        assert e4m3_encode(x).tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x00, 0x80, 0x80, 0x7C, 0xFC]

    def test_nan(self):
        x = torch.tensor([math.nan, -math.nan])
        codes = e4m3_encode(x).tolist()
        signs = [int(b) >> 31 for b in f32_bits(x)]
        assert codes == [0x7F | (s << 7) for s in signs]

    def test_decode_all_codes(self):
        codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
        ours = e4m3_decode(codes)
        ref = codes.view(torch.float8_e4m3fn).float()
        nan = ref.isnan()
        assert torch.equal(ours.isnan(), nan)
        assert nan.sum() == 2
        assert torch.equal(ours[~nan].view(torch.int32), ref[~nan].view(torch.int32))

    def test_decode_encode_round_trip(self):
        codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.int64).to(torch.uint8)
        assert torch.equal(e4m3_encode(e4m3_decode(codes)), codes)


E2M1_MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_bruteforce(x: torch.Tensor) -> list[int]:
    """Nearest of the 8 magnitudes in float64, ties to the even code, |x| >= 6 and NaN
    saturated to code 7, sign bit copied."""
    out = []
    for v, b in zip(x.double().tolist(), f32_bits(x).tolist(), strict=True):
        sign = (b >> 31) << 3
        if math.isnan(v) or abs(v) >= 6.0:
            out.append(sign | 7)
            continue
        a = abs(v)
        dists = [abs(a - m) for m in E2M1_MAGNITUDES]
        best = min(dists)
        candidates = [c for c, d in enumerate(dists) if d == best]
        code = min(candidates, key=lambda c: c % 2)
        out.append(sign | code)
    return out


class TestE2m1:
    def test_spec_table(self):
        cases = [
            (0.25, 0), (float(f32(0x3E800001)[0]), 1), (0.75, 2), (0.7499999, 1), (1.25, 2),
            (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (5.0001, 7), (6.0, 7), (7.0, 7), (math.inf, 7),
            (0.1, 0), (4.0, 6),
        ]
        x = torch.tensor([v for v, _ in cases], dtype=torch.float32)
        assert e2m1_encode(x).tolist() == [c for _, c in cases]
        assert e2m1_encode(-x).tolist() == [c | 8 for _, c in cases]
        assert e2m1_encode(torch.tensor([-0.0, -0.1, 0.0])).tolist() == [8, 8, 0]

    def test_nan_saturates_with_sign(self):
        x = torch.tensor([math.nan, -math.nan])
        signs = [int(b) >> 31 for b in f32_bits(x)]
        assert e2m1_encode(x).tolist() == [(s << 3) | 7 for s in signs]

    def test_against_bruteforce(self):
        mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64)
        mids = ((mags[1:] + mags[:-1]) / 2).float()
        near = torch.cat([mids, torch.nextafter(mids, torch.zeros_like(mids)),
                          torch.nextafter(mids, torch.full_like(mids, 10.0)), mags.float()])
        x = torch.cat([random_floats(3000, 4, lo_exp=-6, hi_exp=4), near, -near, SPECIALS])
        assert e2m1_encode(x).tolist() == e2m1_bruteforce(x)

    def test_decode(self):
        codes = torch.arange(16, dtype=torch.int64).to(torch.uint8)
        expected = torch.tensor(E2M1_MAGNITUDES + [-m for m in E2M1_MAGNITUDES])
        out = e2m1_decode(codes)
        assert torch.equal(out, expected)
        assert torch.equal(out.view(torch.int32), expected.view(torch.int32))  # code 8 is -0.0

    def test_pack_order_and_round_trip(self):
        codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
        packed = e2m1_pack(codes)
        assert packed.dtype == torch.int8
        assert packed.view(torch.uint8).tolist() == [[0x21, 0x8F]]
        assert torch.equal(e2m1_unpack(packed), codes)
        g = torch.Generator().manual_seed(5)
        many = torch.randint(0, 16, (7, 3, 64), generator=g).to(torch.uint8)
        assert torch.equal(e2m1_unpack(e2m1_pack(many)), many)
        assert torch.equal(e2m1_unpack(e2m1_pack(many).view(torch.uint8)), many)

    def test_pack_rejects_odd(self):
        with pytest.raises(ValueError):
            e2m1_pack(torch.zeros(3, dtype=torch.uint8))


class TestUe8m0:
    def test_spec_examples(self):
        q448 = torch.full((1,), 448.0)
        amax = torch.tensor([3.0, 448.0, float(f32(0x43E00001)[0]), float(f32(0x43DFFFFF)[0]),
                             float(torch.tensor(1e-4, dtype=torch.float32))])
        assert ue8m0_encode_ceil(amax / q448).tolist() == [120, 127, 128, 127, 105]
        assert ue8m0_encode_ceil(torch.tensor([1.0]) / torch.tensor([6.0])).tolist() == [125]
        assert ue8m0_encode_ceil(torch.tensor([6 * 2.0**-126]) / torch.tensor([6.0])).tolist() == [1]

    def test_against_float64_ceil_log2(self):
        x = random_floats(5000, 6, lo_exp=-120, hi_exp=120).abs()
        # v = m·2^e with m in [0.5, 1): ceil(log2 v) is e - 1 for m == 0.5, else e.
        expected = []
        for v in x.double().tolist():
            m, e = math.frexp(v)
            expected.append((e - 1 if m == 0.5 else e) + 127)
        assert ue8m0_encode_ceil(x).tolist() == expected

    def test_decode(self):
        out = ue8m0_decode(torch.tensor([0, 1, 120, 127, 128, 254, 255], dtype=torch.uint8))
        assert out.tolist() == [0.0, 2.0**-126, 2.0**-7, 1.0, 2.0, 2.0**127, math.inf]


def word(bytes_: list[int], nbytes: int) -> int:
    value = sum(b << (8 * j) for j, b in enumerate(bytes_))
    return value - (1 << (8 * nbytes)) if value >= 1 << (8 * nbytes - 1) else value


class TestUe8m0Pack:
    def exps(self, rows: int, cols: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 256, (rows, cols), generator=g).to(torch.uint8)

    def test_cuda_row_major_example(self):
        e = self.exps(5, 8, 7)
        words = ue8m0_pack(e, 4, dim=1)
        assert words.dtype == torch.int32 and tuple(words.shape) == (5, 2)
        for t in range(5):
            assert int(words[t, 1]) == word([int(e[t, k]) for k in range(4, 8)], 4)
        assert torch.equal(ue8m0_unpack(words, 4, dim=1, n=8), e)

    def test_ascend_row_major_example(self):
        e = self.exps(3, 8, 8)
        words = ue8m0_pack(e, 2, dim=1)
        assert words.dtype == torch.int16 and tuple(words.shape) == (3, 4)
        for t in range(3):
            for c in range(4):
                assert int(words[t, c]) == word([int(e[t, 2 * c]), int(e[t, 2 * c + 1])], 2)

    @pytest.mark.parametrize("pack", [2, 4])
    def test_along_m_example(self, pack):
        e = self.exps(4, 64, 9)  # block (32, 1), M = 100: nbm = 4
        words = ue8m0_pack(e, pack, dim=0)
        assert tuple(words.shape) == (4 // pack, 64) and words.is_contiguous()
        for r in range(4 // pack):
            for k in range(64):
                assert int(words[r, k]) == word([int(e[pack * r + j, k]) for j in range(pack)], pack)
        assert torch.equal(ue8m0_unpack(words, pack, dim=0, n=4), e)

    @pytest.mark.parametrize("pack", [2, 4])
    @pytest.mark.parametrize("dim", [0, 1])
    def test_unused_bytes_zero_and_round_trip(self, pack, dim):
        e = self.exps(5, 7, 10 + pack + dim)
        words = ue8m0_pack(e, pack, dim=dim)
        n = e.shape[dim]
        num_words = -(-n // pack)
        assert words.shape[dim] == num_words
        raw = words.to(torch.int64) & ((1 << (8 * pack)) - 1)
        last = raw.select(dim, num_words - 1)
        used = n - (num_words - 1) * pack
        assert (last >> (8 * used) == 0).all()
        assert torch.equal(ue8m0_unpack(words, pack, dim=dim, n=n), e)

    def test_bad_pack(self):
        with pytest.raises(ValueError):
            ue8m0_pack(torch.zeros(2, 2, dtype=torch.uint8), 3, dim=1)
