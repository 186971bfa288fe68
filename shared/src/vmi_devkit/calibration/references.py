"""References for the calibration kernels: what each vector instruction computes by its documented
semantics and by the model's stated assumptions (vmi-core README, "ascend-sim assumptions"),
in numpy, with exact rationals where no library rounds as the instruction does.

A NaN the vector unit computes is 0x7FFFFFFF; the division unit flushes subnormal operands and
results to zero; max/min of a NaN is NaN; a b32 predicate sets the lowest bit of each lane. These
references are written from the pages and the table, not from the model's code: the model agrees
with them (its tests), and an NPU agrees with them or settles a row of the table against the model.
"""

from fractions import Fraction

import numpy as np
import torch

from ..sim_kernels import (
    COMPARES,
    DMA_BURST,
    DMA_ROW,
    DMA_ROWS,
    GATHER_BASE,
    GATHER_OUT_ROWS,
    GATHER_ROWS,
    GATHER_TABLE_BYTES,
    LANES,
    LOAD_ROWS,
    LOADS,
    PATTERNS,
    PREDICATE_LOADS,
    REARRANGED,
    ROUNDS,
    ROWS,
    SCATTER_BYTES,
    SIMT_FLOAT_INPUTS,
    SIMT_LANES,
    SIMT_OPS,
    STORE_ROWS,
)

NAN32 = 0x7FFFFFFF  # the NaN the vector unit writes

# ---- number formats, exactly ---------------------------------------------------------------------

# name -> (exponent bits, mantissa bits, bias, kind): "ieee" has inf and NaN, "fn" only S.1111.111 NaN
# (e4m3fn), "fp4" neither (e2m1).
FORMATS = {"f32": (8, 23, 127, "ieee"), "bf16": (8, 7, 127, "ieee"), "f16": (5, 10, 15, "ieee"),
           "e4m3": (4, 3, 7, "fn"), "e5m2": (5, 2, 15, "ieee"), "e2m1": (2, 1, 1, "fp4")}
ROUND_OF = {"ROUND_R": "rint", "ROUND_A": "away", "ROUND_F": "floor", "ROUND_C": "ceil", "ROUND_Z": "trunc",
            "ROUND_O": "odd"}


def _width(fmt):
    e, m, _, _ = FORMATS[fmt]
    return 1 + e + m


def _max_code(fmt):
    e, m, _, kind = FORMATS[fmt]
    if kind == "ieee":
        return ((1 << e) - 2) << m | ((1 << m) - 1)
    if kind == "fn":
        return ((1 << e) - 1) << m | ((1 << m) - 2)
    return (1 << (e + m)) - 1


def decode(code: int, fmt: str):
    """A code's value: a Fraction, or the string "nan" / "+inf" / "-inf" / "-0"."""
    e_bits, m_bits, bias, kind = FORMATS[fmt]
    width = _width(fmt)
    neg = code >> (width - 1) & 1
    e, m = code >> m_bits & ((1 << e_bits) - 1), code & ((1 << m_bits) - 1)
    if kind == "ieee" and e == (1 << e_bits) - 1:
        return "nan" if m else ("-inf" if neg else "+inf")
    if kind == "fn" and code & ((1 << (width - 1)) - 1) == (1 << (width - 1)) - 1:
        return "nan"
    value = Fraction(m, 1 << m_bits) * Fraction(2) ** (1 - bias) if e == 0 else \
        (1 + Fraction(m, 1 << m_bits)) * Fraction(2) ** (e - bias)
    if neg and value == 0:
        return "-0"
    return -value if neg else value


def value_of_f32(x) -> object:
    x = np.float32(x)
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return "-0" if x == 0 and np.signbit(x) else Fraction(float(x))


def _round_integer(m: Fraction, neg: bool, mode: str) -> int:
    """|x| = m rounded to an integer by ``mode`` (x's sign is ``neg``)."""
    q, rest = divmod(m, 1)
    half = Fraction(1, 2)
    up = {"rint": rest > half or (rest == half and q % 2 == 1), "away": rest >= half, "floor": neg and rest > 0,
          "ceil": not neg and rest > 0, "trunc": False, "odd": False}[mode]
    if mode == "odd" and rest:
        q |= 1
    return int(q) + up


def encode(value, fmt: str, mode: str = "rint", saturate: bool = False) -> int:
    """The code of ``value`` (a Fraction or "nan"/"+inf"/"-inf"/"-0") in ``fmt``, by the documented rules:
    saturating, NaN -> 0 and past the largest finite value (inf too) -> it; not saturating, NaN -> NaN,
    inf -> inf and a finite overflow as IEEE 754 rounds for the direction (e4m3fn: NaN); e2m1 has no
    NaN (-> 0) and no inf (-> the largest value)."""
    e_bits, m_bits, bias, kind = FORMATS[fmt]
    width = _width(fmt)
    top = 1 << (width - 1)
    nan_code = top - 1
    if value == "nan":
        return 0 if saturate or kind == "fp4" else nan_code
    neg = value in ("-inf", "-0") or (not isinstance(value, str) and value < 0)
    sign = top if neg else 0
    inf_code = ((1 << e_bits) - 1) << m_bits
    if value == "-0":
        return sign
    if isinstance(value, str):
        magnitude = None
    else:
        m = -value if value < 0 else value
        emin = 1 - bias
        if m == 0:
            return sign
        e = m.numerator.bit_length() - m.denominator.bit_length()
        if Fraction(2) ** e > m:
            e -= 1
        ulp = Fraction(2) ** (max(e, emin) - m_bits)
        q = _round_integer(m / ulp, neg, mode)
        magnitude = q * ulp
    if magnitude is not None and magnitude <= decode(_max_code(fmt), fmt):
        if magnitude < Fraction(2) ** (1 - bias):
            return sign | int(magnitude / Fraction(2) ** (1 - bias - m_bits))
        e = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
        if Fraction(2) ** e > magnitude:
            e -= 1
        return sign | (e + bias) << m_bits | int(magnitude / Fraction(2) ** (e - m_bits)) - (1 << m_bits)
    if saturate or kind == "fp4":
        return sign | _max_code(fmt)
    if kind == "fn":
        return sign | nan_code
    to_inf = magnitude is None or mode in ("rint", "away") or (mode == "floor" and neg) or (mode == "ceil" and not neg)
    return sign | (inf_code if to_inf else _max_code(fmt))


def to_float32(value) -> np.float32:
    return np.uint32(encode(value, "f32")).view(np.float32) if value != "nan" else np.uint32(NAN32).view(np.float32)


F32 = np.float32
LANE = np.arange(LANES)


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(F32)


def canonical(x) -> np.ndarray:
    """Float results as the unit writes them: any NaN is 0x7FFFFFFF."""
    x = np.asarray(x, dtype=F32)
    return np.where(np.isnan(x), f32(NAN32), x)


def fma(a, b, c) -> np.ndarray:
    """a * b + c with one rounding, exactly."""
    out = np.empty(np.broadcast(a, b, c).shape, dtype=F32)
    for index in np.ndindex(out.shape):
        x, y, z = (np.broadcast_to(v, out.shape)[index] for v in (a, b, c))
        if not all(np.isfinite([x, y, z])):
            out[index] = F32(x) * F32(y) + F32(z)
        else:
            out[index] = to_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
            if out[index] == 0 and (np.signbit(x) != np.signbit(y)) and np.signbit(z):
                out[index] = F32(-0.0)
    return canonical(out)


def flush(x) -> np.ndarray:
    return np.where(np.abs(x) < F32(2.0**-126), np.copysign(F32(0), x), x).astype(F32)


def precise_div(a, b) -> np.ndarray:
    """TileLang's default vdiv (simd_inst::vdiv_0ulp_ftz_true): the division unit's quotient z
    (operands and result flushed, correctly rounded), kept when it is 0, inf or NaN; otherwise
    z - 1 ulp and z + 1 ulp compete on |a - z*b| (fused), z - 1 ulp winning ties."""
    with np.errstate(all="ignore"):
        z = canonical(flush(flush(a) / flush(b)))
    out = z.copy()
    for index in np.ndindex(z.shape):
        q = z[index]
        if q == 0 or not np.isfinite(q):
            continue
        candidates = [f32(int(q.view(np.uint32)) + step) for step in (0, -1, 1)]
        r, r_pre, r_next = (np.abs(fma(c, -b[index], a[index])) for c in candidates)
        if not r < r_pre:
            r, q = r_pre, candidates[1]
        out[index] = candidates[2] if r_next < r else q
    return out


def vmax(a, b) -> np.ndarray:
    """max with a NaN giving NaN and max(-0, +0) = +0."""
    a, b = np.broadcast_arrays(F32(a), F32(b))
    out = np.where(a > b, a, b)
    out = np.where((a == b) & np.signbit(b), a, out)
    return canonical(np.where(np.isnan(a) | np.isnan(b), F32(np.nan), out))


def vmin(a, b) -> np.ndarray:
    a, b = np.broadcast_arrays(F32(a), F32(b))
    out = np.where(a < b, a, b)
    out = np.where((a == b) & np.signbit(a), a, out)
    return canonical(np.where(np.isnan(a) | np.isnan(b), F32(np.nan), out))


def _add(x, y):
    with np.errstate(all="ignore"):
        return canonical(F32(x) + F32(y))


def tree_sum(values, active, add=_add):
    """Pairwise adjacent sums, level by level; an inactive lane takes no part; no active lane -> 0."""
    nodes = [(v, bool(on)) for v, on in zip(values, active, strict=True)]
    while len(nodes) > 1:
        nodes = [(add(a, b) if pa and pb else a if pa else b, pa or pb)
                 for (a, pa), (b, pb) in zip(nodes[::2], nodes[1::2], strict=True)]
    return nodes[0][0] if nodes[0][1] else type(values[0])(0)


def extreme(values, active, largest: bool, floats: bool):
    """(value, index) of vcmax/vcmin: the first NaN wins; -0 orders below +0; none active -> -inf/+inf
    (integers: the type's minimum/maximum) and index 0."""
    best, best_key, at = None, None, 0
    for i, (x, on) in enumerate(zip(values, active, strict=True)):
        if not on:
            continue
        if floats and np.isnan(x):
            return f32(NAN32), i
        key = (x, not np.signbit(x)) if floats else x
        if best is None or (key > best_key if largest else key < best_key):
            best, best_key, at = x, key, i
    if best is None:
        if floats:
            return F32(-np.inf if largest else np.inf), 0
        info = np.iinfo(values.dtype)
        return values.dtype.type(info.min if largest else info.max), 0
    return best, at


def float_reference(a, b) -> dict:
    """Expected int32 bit patterns per op, each (ROWS, 64)."""
    ref = {}
    with np.errstate(all="ignore"):
        ref["add"], ref["sub"], ref["mul"] = canonical(a + b), canonical(a - b), canonical(a * b)
        ref["div"] = precise_div(a, b)
        ref["sqrt"] = canonical(np.sqrt(flush(a)))  # the instruction: operand flushed, correctly rounded
        ref["max"], ref["min"] = vmax(a, b), vmin(a, b)
        ref["abs"], ref["neg"] = f32(a.view(np.uint32) & 0x7FFFFFFF), f32(a.view(np.uint32) ^ 0x80000000)
        ref["adds"], ref["muls"] = canonical(a + F32(1.5)), canonical(a * F32(-3.0))
        ref["maxs"], ref["mins"] = vmax(a, F32(0.0)), vmin(a, F32(-0.0))
        ref["mula"], ref["madd"], ref["axpy"] = fma(a, b, F32(0.75)), fma(F32(0.75), a, b), fma(F32(3.0), a, F32(0.75))
        ref["add_merging"] = np.where(a < b, canonical(a + b), F32(7.0))
        ref["select_gt"] = np.where(a > b, a, b)
    for op, fn in zip(COMPARES, (np.equal, np.not_equal, np.greater, np.greater_equal, np.less, np.less_equal),
                      strict=True):
        ref[f"cmp_{op}"] = fn(a, b).astype(np.int32)
        ref[f"cmps_{op}"] = fn(a, F32(0.0)).astype(np.int32)
    every, vl16, m3, none = np.ones(LANES, bool), LANE < 16, LANE % 3 == 0, np.zeros(LANES, bool)
    for name in ("cadd", "cadd_vl16", "cmax", "cmin", "cmax_m3", "cmin_none", "cgadd", "cgmax", "cgmin_m3", "cpadd_m3"):
        ref[name] = np.zeros((ROWS, LANES), np.uint32)
    for r in range(ROWS):
        ref["cadd"][r, 0] = F32(tree_sum(a[r], every)).view(np.uint32)
        ref["cadd_vl16"][r, 0] = F32(tree_sum(a[r], vl16)).view(np.uint32)
        for name, active, largest in (("cmax", every, True), ("cmin", every, False), ("cmax_m3", m3, True),
                                      ("cmin_none", none, False)):
            value, index = extreme(a[r], active, largest, floats=True)
            ref[name][r, 0], ref[name][r, 1] = F32(value).view(np.uint32), index
        for block in range(8):
            part = slice(8 * block, 8 * block + 8)
            ref["cgadd"][r, block] = F32(tree_sum(a[r, part], every[part])).view(np.uint32)
            ref["cgmax"][r, block] = F32(extreme(a[r, part], every[part], True, True)[0]).view(np.uint32)
            ref["cgmin_m3"][r, block] = F32(extreme(a[r, part], m3[part], False, True)[0]).view(np.uint32)
        for k in range(LANES // 2):
            ref["cpadd_m3"][r, k] = F32(tree_sum(a[r, 2 * k:2 * k + 2], m3[2 * k:2 * k + 2])).view(np.uint32)
    ref["dup"] = np.full((ROWS, LANES), F32(2.5))
    ref["ci"] = np.broadcast_to(F32(-0.5) + LANE.astype(F32), (ROWS, LANES))
    return {name: np.ascontiguousarray(v).view(np.int32) if v.dtype != np.int32 else v for name, v in ref.items()}


def _wrap(x) -> np.ndarray:
    return (np.asarray(x, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def shift_left(x, s) -> np.ndarray:
    """Arithmetic left shift of int32: the sign bit stays, the bit below it drops; past 32 -> 0."""
    x64, s = np.asarray(x, np.int64), np.asarray(s, np.int64)
    kept = np.where(s >= 32, 0, (x64 << np.minimum(s, 31)) & 0x7FFFFFFF)
    return _wrap(np.where(s > 32, 0, (x64 & 0x80000000) | kept))


def int_reference(i, j, s, row) -> dict:
    u, uj, us = i.view(np.uint32), j.view(np.uint32), s.view(np.uint32)
    i64, j64 = i.astype(np.int64), j.astype(np.int64)
    ref = {"add": _wrap(i64 + j64), "sub": _wrap(i64 - j64), "mul": _wrap(i64 * j64), "max": np.maximum(i, j),
           "min": np.minimum(i, j), "max_u32": np.maximum(u, uj).view(np.int32), "abs": _wrap(np.abs(i64)),
           "neg": _wrap(-i64), "adds": _wrap(i64 + 7), "muls": _wrap(i64 * -3), "maxs": np.maximum(i, -5),
           "mins": np.minimum(i, 5), "and": i & j, "or": i | j, "xor": i ^ j, "not": ~i,
           "shl": shift_left(i, s), "shr": np.where(s >= 32, np.where(i < 0, -1, 0), i >> np.minimum(s, 31)),
           "shl_u32": _wrap(np.where(us >= 32, 0, u.astype(np.uint64) << np.minimum(us, 31).astype(np.uint64))),
           "shr_u32": np.where(us >= 32, 0, u >> np.minimum(us, 31)).astype(np.uint32).view(np.int32),
           "shls": shift_left(i, 3), "shrs": i >> 3, "shrs_u32": (u >> 3).view(np.int32)}
    for op, fn in zip(COMPARES, (np.equal, np.not_equal, np.greater, np.greater_equal, np.less, np.less_equal),
                      strict=True):
        ref[f"cmp_{op}"] = fn(i, j).astype(np.int32)
        ref[f"cmps_{op}"] = fn(i, 0).astype(np.int32)
    ref["cmps_lt_u32"] = (u < 0x80000000).astype(np.int32)
    positive, odd = i > 0, (j & 1) == 1
    m3 = LANE % 3 == 0
    ref.update(pand=positive & odd, por=positive | odd, pxor=positive ^ odd, pnot=~positive,
               pnot_vl16=~positive & (LANE < 16), psel=np.where(m3, positive, odd))
    # A b16 pattern read by 32-bit lanes: its lane k sets byte 2k, so 32-bit lane i sees lane 2i's bit.
    patterns = {"every": LANE >= 0, "vl16": LANE < 16, "m3": m3, "m4": LANE % 4 == 0, "low_half": LANE < 32,
                "low_quarter": LANE < 16, "none": LANE < 0, "b16_vl16": 2 * LANE < 16, "b8_all": LANE >= 0}
    assert set(patterns) == set(PATTERNS)
    for name, lanes in patterns.items():
        ref[f"pset_{name}"] = np.broadcast_to(lanes, (ROWS, LANES))
    ref["update_mask"] = LANE[None, :] < (row * 9 + 3)[:, None]
    ref["add_masked"] = np.where(m3, _wrap(i64 + j64), 0)
    for name in ("cadd", "cmax", "cmin_u32", "cmax_m4", "cgmax"):
        ref[name] = np.zeros((ROWS, LANES), np.int32)
    for r in range(ROWS):
        ref["cadd"][r, 0] = _wrap(i64[r].sum())
        ref["cmax"][r, :2] = extreme(i[r], LANE >= 0, True, floats=False)
        value, index = extreme(u[r], LANE >= 0, False, floats=False)
        ref["cmin_u32"][r, :2] = np.uint32(value).view(np.int32), index
        ref["cmax_m4"][r, :2] = extreme(i[r], LANE % 4 == 0, True, floats=False)
        ref["cgmax"][r, :8] = i[r].reshape(8, 8).max(1)
    ref["ci"] = np.broadcast_to(LANE - 3, (ROWS, LANES))
    ref["ci_desc"] = np.broadcast_to(100 + 63 - LANE, (ROWS, LANES))
    ref["dup"] = np.full((ROWS, LANES), -123)
    return {name: np.asarray(v).astype(np.int32) for name, v in ref.items()}


def _narrow(codes, width_bits: int, part: int, active) -> np.ndarray:
    """A register holding ``codes`` of 32-bit source lane j at narrow element part + r*j (zeros elsewhere)."""
    per = 32 // width_bits
    out = np.zeros((ROWS, LANES * per), dtype={8: np.uint8, 16: np.uint16}[width_bits])
    out[:, part::per] = np.where(active, codes, 0)
    return out.view(np.int32)


def convert_reference(a, i, h) -> dict:
    """Expected bit patterns of the convert family (the conversion rules of Cast.md, via ``encode``)."""
    av = [[value_of_f32(x) for x in row] for row in a]
    hv = [[decode(int(c), "bf16") for c in row] for row in h.view(np.uint16)]
    every = np.ones((ROWS, LANES), bool)

    def codes(values, fmt, mode="ROUND_R", saturate=True):
        return np.array([[encode(v, fmt, ROUND_OF[mode], saturate) for v in row] for row in values], dtype=np.int64)

    def widen(fmt, source_codes, part, per):
        values = source_codes[:, part::per]
        return np.array([[to_float32(decode(int(c), fmt)).view(np.uint32) for c in row] for row in values],
                        dtype=np.uint32).view(np.int32)

    def to_int32(values, mode, saturate):
        out = np.zeros((ROWS, LANES), np.int64)
        for r, row in enumerate(values):
            for k, v in enumerate(row):
                if v in ("nan", "-0"):
                    continue
                if isinstance(v, str):
                    out[r, k] = -2**31 if v == "-inf" else 2**31 - 1
                    continue
                n = _round_integer(abs(v), v < 0, ROUND_OF[mode]) * (-1 if v < 0 else 1)
                out[r, k] = min(max(n, -2**31), 2**31 - 1) if saturate else (n + 2**31) % 2**32 - 2**31
        return out.astype(np.int32)

    ref = {}
    for mode in ROUNDS:
        ref[f"f32_bf16_{mode}"] = _narrow(codes(av, "bf16", mode), 16, 0, every)
        ref[f"f32_s32_{mode}"] = to_int32(av, mode, True)
    for mode in (*ROUNDS, "ROUND_O"):
        ref[f"f32_f16_{mode}"] = _narrow(codes(av, "f16", mode), 16, 0, every)
    ref["f32_bf16_odd"] = _narrow(codes(av, "bf16"), 16, 1, every)
    ref["f32_bf16_nosat"] = _narrow(codes(av, "bf16", saturate=False), 16, 0, every)
    ref["f32_f16_nosat_odd"] = _narrow(codes(av, "f16", saturate=False), 16, 1, every)
    for p in range(4):
        ref[f"f32_e4m3_p{p}"] = _narrow(codes(av, "e4m3"), 8, p, every)
    ref["f32_e4m3_nosat"] = _narrow(codes(av, "e4m3", saturate=False), 8, 0, every)
    ref["f32_e5m2_p1"] = _narrow(codes(av, "e5m2"), 8, 1, every)
    ref["f32_e5m2_nosat"] = _narrow(codes(av, "e5m2", saturate=False), 8, 0, every)
    ref["f32_s32_nosat"] = to_int32(av, "ROUND_R", False)
    iv = [[Fraction(int(x)) for x in row] for row in i]
    ref["s32_f32_R"] = codes(iv, "f32").astype(np.uint32).view(np.int32)
    ref["s32_f32_Z"] = codes(iv, "f32", "ROUND_Z").astype(np.uint32).view(np.int32)
    h16 = h.view(np.uint16).astype(np.int64)
    ref["bf16_f32_even"] = (h16[:, 0::2] << 16).astype(np.uint32).view(np.int32)
    ref["bf16_f32_odd"] = (h16[:, 1::2] << 16).astype(np.uint32).view(np.int32)
    ref["f16_f32_odd"] = widen("f16", h16, 1, 2)
    bytes_ = i.view(np.uint8).astype(np.int64)
    for p in range(4):
        ref[f"e4m3_f32_p{p}"] = widen("e4m3", bytes_, p, 4)
    ref["e5m2_f32_p3"] = widen("e5m2", bytes_, 3, 4)
    ref["bf16_f16_Z"] = codes(hv, "f16", "ROUND_Z").astype(np.uint16).view(np.int32)
    ref["bf16_f16_nosat"] = codes(hv, "f16", saturate=False).astype(np.uint16).view(np.int32)
    f16v = [[decode(int(c), "f16") for c in row] for row in h16]
    ref["f16_bf16_C"] = codes(f16v, "bf16", "ROUND_C", saturate=False).astype(np.uint16).view(np.int32)
    ref["bf16_s32_F_odd"] = to_int32([row[1::2] for row in hv], "ROUND_F", True)
    for p, mode in ((0, "ROUND_R"), (3, "ROUND_R"), (1, "ROUND_Z")):
        nibbles = codes(hv, "e2m1", mode, saturate=False)
        packed = np.zeros((ROWS, 256), np.uint8)
        packed[:, p::4] = nibbles[:, 0::2] | nibbles[:, 1::2] << 4
        name = f"bf16_e2m1_p{p}" if mode == "ROUND_R" else f"bf16_e2m1_Z_p{p}"
        ref[name] = packed.view(np.int32)
    nib = bytes_[:, 2::4]
    unpacked = np.zeros((ROWS, 128), np.int64)
    for k, shift in ((0, 0), (1, 4)):
        unpacked[:, k::2] = [[encode(decode(int(c) >> shift & 0xF, "e2m1"), "bf16") for c in row] for row in nib]
    ref["e2m1_bf16_p2"] = unpacked.astype(np.uint16).view(np.int32)
    ref["f32_bf16_m3"] = _narrow(codes(av, "bf16"), 16, 0, LANE % 3 == 0)
    ref["bf16_f32_b16_vl16_odd"] = np.where(LANE < 8, ref["bf16_f32_odd"], 0)
    return ref


SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1.1754944e-38, -1e-45,
                     3.4e38, -3.4e38, 0.1, 3.0, 448.0, 464.0, 465.0, -480.0, 57344.0, 61440.0, 65504.0, 65520.0,
                     1e30, -1e-30, 7.0, 0.75, 2.0**-10, 2.0**-9 * 1.5, 2.0**24 + 2, 2.0**31, -2.0**31, 3e9, -2.5e9],
                    dtype=F32)


def _specials() -> np.ndarray:
    return np.resize(SPECIALS, LANES)


def _floats(rng, shape) -> np.ndarray:
    return (rng.choice([-1, 1], shape) * np.exp(rng.normal(size=shape) * 6)).astype(F32)


def family_inputs(family: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    specials = _specials()
    a = _floats(rng, (ROWS, LANES))
    b = _floats(rng, (ROWS, LANES))
    a[0], b[0] = specials, np.roll(specials, 7)
    a[1], b[1] = specials, specials  # equal pairs: ties, -0 against +0 below
    b[1, 0], b[1, 1] = F32(-0.0), F32(0.0)
    a[2, 9] = f32(0xFFC00001)  # a negative NaN with a payload
    a[3, :32] = np.round(a[3, :32] * 64) / 64  # values the narrow formats hold exactly, and their ties
    if family == "float":
        return {"a": a, "b": b}
    if family == "int":
        i = rng.integers(-2**31, 2**31, (ROWS, LANES), dtype=np.int64).astype(np.int32)
        j = rng.integers(-2**31, 2**31, (ROWS, LANES), dtype=np.int64).astype(np.int32)
        i[0, :8] = [0, -1, 1, -2**31, 2**31 - 1, 5, -5, 7]
        j[0, :8] = [0, 1, -1, -1, 1, 5, -6, 7]
        i[1] = rng.integers(-40, 40, LANES)
        return {"i": i, "j": j, "s": rng.integers(0, 41, (ROWS, LANES)).astype(np.int32)}
    if family == "rearrange":
        # Indices past the lane count in every row but the first (they wrap), any 32 bits from row 2 on.
        idx = rng.integers(0, 2**32, (ROWS, LANES), dtype=np.uint64).astype(np.uint32)
        idx[0], idx[1] = LANE[::-1], LANE + 40
        return {"a": a.view(np.int32), "b": b.view(np.int32), "idx": idx.view(np.int32)}
    i = rng.integers(-2**31, 2**31, (ROWS, LANES), dtype=np.int64).astype(np.int32)
    i[1, :16] = [2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**25 + 6, 2**31 - 1, -2**31, 0, 1, -1, 2**30 + 65,
                 16777217 * 3, 123456789, -987654321, 2**24, 7, 99]
    h = rng.integers(0, 1 << 16, (ROWS, 2 * LANES)).astype(np.uint16)
    small = rng.choice([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 0.1, 4.2, 9.0, np.inf, np.nan], (4, 2 * LANES))
    h[4:] = torch.from_numpy((small * rng.choice([-1, 1], small.shape)).astype(F32)).to(torch.bfloat16).view(
        torch.int16).numpy().view(np.uint16)
    return {"a": a, "i": i, "h": h.view(np.int32)}


def rearrange_reference(a, b, idx) -> dict:
    """Register gathers (index modulo the lane count), lowest-lane broadcasts, and interleaves of the
    2N-element stream a0 b0 a1 b1 ... / de-interleaves of the stream a, b, as bit patterns."""
    widths = {"uint32": np.uint32, "float32": np.uint32, "uint16": np.uint16, "uint8": np.uint8}
    ref = {}
    for name, elem in REARRANGED.items():
        dtype = widths[elem]
        av, bv, iv = (np.ascontiguousarray(x).view(dtype) for x in (a, b, idx))
        n = av.shape[1]
        ref[f"selr_{name}"] = np.take_along_axis(av, iv.astype(np.int64) % n, axis=1)
        woven = np.empty((ROWS, 2 * n), dtype)
        woven[:, 0::2], woven[:, 1::2] = av, bv
        ref[f"intlv_{name}_0"], ref[f"intlv_{name}_1"] = woven[:, :n], woven[:, n:]
        joined = np.concatenate([av, bv], axis=1)
        ref[f"dintlv_{name}_0"], ref[f"dintlv_{name}_1"] = joined[:, 0::2], joined[:, 1::2]
    a16 = np.ascontiguousarray(a).view(np.uint16)
    ref["dupv"] = np.repeat(a[:, :1], LANES, axis=1)
    ref["dupv_m3"] = np.where(LANE % 3 == 0, a[:, :1], 0)
    ref["dupv_u16"] = np.repeat(a16[:, :1], 2 * LANES, axis=1)
    return {name: np.ascontiguousarray(v).view(np.int32) for name, v in ref.items()}



def _bit(bits: np.ndarray, index) -> np.ndarray:
    """Bit ``index`` of a little-endian bit string: bit i % 8 of byte i // 8."""
    index = np.asarray(index)
    return (bits[index // 8] >> (index % 8)) & 1


def memory_inputs(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A byte image for the loads and a sentinel image the stores write into."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, 1024, dtype=np.uint8), rng.integers(0, 256, STORE_ROWS * 256, dtype=np.uint8)


def memory_reference(image: np.ndarray, sentinel: np.ndarray):
    """Registers of every load (by the LoadAlign distribution table) and the three output images."""
    u16, u32 = image.view(np.uint16), image.view(np.uint32)
    loads = {}

    def register(values) -> np.ndarray:
        return np.ascontiguousarray(values).view(np.int32)

    for name, (dtype, offset, dist) in LOADS.items():
        width = np.dtype(dtype).itemsize
        src = image.view(dtype)[offset:]
        n = 256 // width
        if dist == "NORM":
            reg = src[:n]
        elif dist.startswith("UNPK4"):
            reg = np.zeros(n, dtype)
            reg[0::4] = src[:n // 4]
        elif dist.startswith("UNPK"):
            reg = np.zeros(n, dtype)
            reg[0::2] = src[:n // 2]
        elif dist.startswith("BRC"):
            reg = np.full(n, src[0], dtype)
        elif dist.startswith("US"):
            reg = np.repeat(src[:n // 2], 2)
        elif dist.startswith("DS"):
            reg = src[:2 * n:2]
        elif dist == "BLK":
            reg = np.tile(src[:32], 8)
        else:  # E2B: one element per 32-byte block
            reg = np.repeat(src[:8], 32 // width)
        loads[name] = register(reg)
    loads["dintlv_b32_even"], loads["dintlv_b32_odd"] = register(u32[0:128:2]), register(u32[1:128:2])
    loads["dintlv_b16_odd"] = register(u16[257:512:2])
    # A predicate read through 32-bit lanes: lane i is predicate bit 4i.
    for name, (offset, dist) in PREDICATE_LOADS.items():
        src = image[4 * offset:]
        step = {"NORM": 4, "US": 2, "DS": 8}[dist]
        loads[name] = _bit(src, step * LANE).astype(np.int32)
    o8, o16, o32 = (sentinel.copy().reshape(STORE_ROWS, 256) for _ in range(3))
    words = u32[64:128]
    every_third = LANE % 3 == 0
    o32[0].view(np.uint32)[every_third] = words[every_third]
    o32[1].view(np.uint32)[5] = words[0]
    o8[1, 13] = image[256]
    halves = u16[256:384]
    pack16 = np.arange(128) % 3 == 0
    o16[1, 128:][pack16] = (halves[pack16] & 0xFF).astype(np.uint8)
    o32[2, :32].view(np.uint16)[:] = np.where(LANE[:16] < 16, words[:16] & 0xFFFF, 0).astype(np.uint16)
    o32[2, 128:192] = (words & 0xFF).astype(np.uint8)
    twelfth = np.arange(256) % 12 == 0
    o8[2][twelfth] = image[512:768][twelfth]
    o32[3, :32] = image[32:64]
    o32[3, 64:80] = image[48:64]
    loads["read_back"] = o32[0].view(np.int32)
    assert list(loads) == LOAD_ROWS
    return np.stack([loads[name] for name in LOAD_ROWS]), (o8, o16, o32)




# UB element counts of the gather kernel's tiles, from the base of its gathers and scatters on.
TABLE32 = GATHER_TABLE_BYTES // 4 - GATHER_BASE // 4
TABLE16 = GATHER_TABLE_BYTES // 2 - GATHER_BASE // 2
OUT32 = SCATTER_BYTES // 4 - GATHER_BASE // 4
OUT16 = SCATTER_BYTES // 2 - GATHER_BASE // 2
FAR = 0x40000000  # an index far past any UB allocation


def gather_inputs(seed: int = 4) -> dict:
    """Tables, index rows (repeats allowed in gathers; inactive lanes of the masked gathers point FAR),
    scatter indices (distinct on active lanes, all 7 on the inactive ones of the masked scatter) and
    sentinel images, as named by the gather kernel."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, GATHER_TABLE_BYTES, dtype=np.uint8)
    i32 = rng.integers(0, TABLE32, (GATHER_ROWS, LANES)).astype(np.uint32)
    i32[0, :4], i32[1, :2] = [5, 5, 0, TABLE32 - 1], [TABLE32 - 1, 0]
    i16 = rng.integers(0, TABLE16, (GATHER_ROWS, 2 * LANES)).astype(np.uint16)
    i16[0, :3] = [TABLE16 - 1, 0, 0]
    im32 = np.where(LANE % 3 == 0, rng.integers(0, TABLE32, (GATHER_ROWS, LANES)), FAR).astype(np.uint32)
    im16 = np.where(np.arange(2 * LANES) % 3 == 0, rng.integers(0, TABLE16, (GATHER_ROWS, 2 * LANES)),
                    0xFFFF).astype(np.uint16)
    s32 = np.where(LANE % 3 == 0, rng.permutation(OUT32)[:LANES], 7).astype(np.uint32)
    s16 = rng.permutation(OUT16)[:2 * LANES].astype(np.uint16)
    values = {"W32": image.view(np.uint32), "WF": image.view(np.float32), "W16": image.view(np.uint16),
              "I32": i32, "IM32": im32, "I16": i16, "IM16": im16, "S32": s32, "S16": s16,
              "Z32": rng.integers(0, 2**32, SCATTER_BYTES // 4, dtype=np.uint64).astype(np.uint32),
              "Z16": rng.integers(0, 2**16, SCATTER_BYTES // 2).astype(np.uint16)}
    return {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in values.items()}


def gather_reference(v: dict):
    """Gathered registers, O32 and O16 by the Gather/Scatter pages: element indices from the base,
    inactive lanes 0 (gathers) or untouched (scatters)."""
    w32, w16 = v["W32"].numpy(), v["W16"].numpy()
    t32, t16 = w32[GATHER_BASE // 4:], w16[GATHER_BASE // 2:]
    m3, b16_m3 = LANE % 3 == 0, np.arange(2 * LANES) % 3 == 0
    rows = {}
    for r in range(GATHER_ROWS):
        rows[f"g32_{r}"] = t32[v["I32"].numpy()[r]]
        rows[f"gf32_m3_{r}"] = np.where(m3, t32[np.where(m3, v["IM32"].numpy()[r], 0)], 0)
        rows[f"g16_{r}"] = t16[v["I16"].numpy()[r]]
        rows[f"g16_m3_{r}"] = np.where(b16_m3, t16[np.where(b16_m3, v["IM16"].numpy()[r], 0)], 0)
    o32, o16 = v["Z32"].numpy().copy(), v["Z16"].numpy().copy()
    s32, s16 = v["S32"].numpy(), v["S16"].numpy()
    o32[GATHER_BASE // 4 + s32[m3]] = w32[:LANES][m3]
    o16[GATHER_BASE // 2 + s16] = w16[:2 * LANES]
    rows["read_back"] = o32[GATHER_BASE // 4 + s32]
    assert set(rows) == set(GATHER_OUT_ROWS)
    return np.stack([np.ascontiguousarray(rows[name]).view(np.int32) for name in GATHER_OUT_ROWS]), o32, o16


def simt_inputs(seed: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """fp32 rows a, b, c (specials against each other, subnormal operands and results, random values
    of every magnitude) and int32 rows (extremes, then random bits)."""
    rng = np.random.default_rng(seed)
    n = SIMT_LANES
    x = _floats(rng, (SIMT_FLOAT_INPUTS, n))
    k = len(SPECIALS)
    for shift in range(k):  # every pair of specials
        x[0, shift * k:(shift + 1) * k] = SPECIALS
        x[1, shift * k:(shift + 1) * k] = np.roll(SPECIALS, shift)
    subnormal = slice(k * k, k * k + 64)
    x[0, subnormal] = (rng.integers(1, 1 << 23, 64) * F32(2.0**-149)).astype(F32)  # subnormal operands
    x[1, subnormal] = np.exp(rng.normal(size=64) * 4).astype(F32) * rng.choice([-1, 1], 64)
    tiny = slice(k * k + 64, k * k + 128)  # normal operands whose product or quotient is subnormal
    x[0, tiny] = (np.exp(rng.normal(size=64)) * 2.0**-70).astype(F32)
    x[1, tiny] = (np.exp(rng.normal(size=64)) * 2.0**-70).astype(F32) * rng.choice([-1, 1], 64)
    x[2, tiny] = (rng.normal(size=64) * 2.0**-140).astype(F32)
    i = rng.integers(-2**31, 2**31, (2, n), dtype=np.int64).astype(np.int32)
    i[:, :6] = [[2**31 - 1, -2**31, -1, 65536, 46341, -2**31], [1, -1, -2**31, 65536, 46341, 2]]
    return x, i


def simt_reference(x: np.ndarray, i: np.ndarray) -> dict:
    """IEEE binary32 rounding to nearest even with subnormals kept, correctly rounded ``/`` and
    ``sqrtf``, ``fmaf`` with one rounding, no contraction; int32 wrapping. NaN results are compared
    as NaN whatever their bits (the SIMT unit's NaN is not documented)."""
    a, b, c = x
    with np.errstate(all="ignore"):
        ref = {"div": a / b, "sqrt": np.sqrt(a), "mul": a * b, "add": a + b, "fma": fma(a, b, c),
               "mul_add": (a * b) + c, "abs": f32(a.view(np.uint32) & 0x7FFFFFFF)}
    ref = {name: canonical(v).view(np.int32) for name, v in ref.items()}
    i64 = i.astype(np.int64)
    ref.update(int_add=_wrap(i64[0] + i64[1]), int_mul=_wrap(i64[0] * i64[1]))
    assert list(ref) == list(SIMT_OPS)
    return ref


def dma_inputs(seed: int = 8) -> np.ndarray:
    """Random bits: a rounding byte that copies another byte is told apart from zeros or stale UB."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**32, (DMA_ROWS, DMA_BURST), dtype=np.uint64).astype(np.uint32)


def dma_reference(x: np.ndarray) -> np.ndarray:
    """Each UB row: its burst, then up to the 32-byte boundary copies of the burst's first element
    (TileLang's copies move bytes, so the element is the burst's first byte)."""
    rows = np.zeros((DMA_ROWS, DMA_ROW * 4), np.uint8)
    burst = np.ascontiguousarray(x).view(np.uint8)
    rows[:, :burst.shape[1]] = burst
    rows[:, burst.shape[1]:] = burst[:, :1]
    return rows.view(np.uint32)
