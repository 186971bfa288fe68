// vmi ascend-sim: the vector unit's number-format conversions, the CCE intrinsic
// `vcvt(dst, src, mask, controls...)` that TileLang's simd_inst::vcvt calls [TL].
//
// Sources:
//  [CAST] asc-devkit docs/zh/api/SIMD-API/基础API/Reg矢量计算/类型转换/Cast.md: the type
//         pairs with their rounding, saturation and layout options (tables 6-8), the
//         saturating / non-saturating results (table 4), the mask read per source element;
//  [LAY]  .../辅助数据类型/RegLayout.md: where PART_* places the narrow elements;
//  [RND]  asc-devkit docs/zh/api/SIMD-API/C-API/reg/data_type_convert/rounding_mode.md;
//  [R]    the C API pages data_type_convert/asc_<src>2<dst>.md.
// A pair, a control or a mode the tables do not list does not compile.
#pragma once

#include "simd.h"

namespace ascend_sim {

// An element format: sign, `exp` exponent bits with `bias`, `man` mantissa bits.
// `ieee`: the top exponent holds inf and NaN; e4m3fn keeps only S.1111.111 for NaN, e2m1
// has neither [CAST constraints].
struct Format {
  int exp, man, bias;
  bool ieee;
  uint32_t max_mag;  // the largest finite magnitude's code
  uint32_t nan;      // the NaN the unit writes (ASSUMPTION: all bits but the sign set); 0: none
};
constexpr Format F32{8, 23, 127, true, 0x7F7FFFFF, 0x7FFFFFFF};
constexpr Format BF16{8, 7, 127, true, 0x7F7F, 0x7FFF};
constexpr Format F16{5, 10, 15, true, 0x7BFF, 0x7FFF};
constexpr Format E4M3{4, 3, 7, false, 0x7E, 0x7F};
constexpr Format E5M2{5, 2, 15, true, 0x7B, 0x7F};
constexpr Format E2M1{2, 1, 1, false, 0x7, 0};

struct Decoded {
  bool neg, nan, inf;
  uint64_t sig;  // |value| = sig * 2^exp2
  int exp2;
};

inline Decoded decode(uint32_t code, const Format &f) {
  const int width = 1 + f.exp + f.man;
  Decoded d{};
  d.neg = (code >> (width - 1)) & 1;
  const uint32_t e = (code >> f.man) & ((1u << f.exp) - 1), m = code & ((1u << f.man) - 1);
  const uint32_t mag = code & ((1u << (width - 1)) - 1);
  if (f.ieee && e == (1u << f.exp) - 1) {
    d.nan = m != 0;
    d.inf = m == 0;
    return d;
  }
  if (!f.ieee && f.nan && mag == f.nan) {
    d.nan = true;
    return d;
  }
  d.sig = e ? m | (1u << f.man) : m;
  d.exp2 = (e ? (int)e : 1) - f.bias - f.man;
  return d;
}

// sig / 2^shift rounded to an integer [RND]: RINT ties to even, AWAY ties away from
// zero, FLOOR / CEIL toward -inf / +inf, TRUNC toward zero, ODD sets the last bit of an
// inexact result. `neg` is the value's sign.
inline uint64_t round_shift(bool neg, uint64_t sig, int shift, VmiRound r) {
  if (shift <= 0) return sig << -shift;  // exact; callers keep the result within 64 bits
  uint64_t q;
  int cmp_half;  // the dropped bits against one half: -1, 0, 1
  bool inexact = sig != 0;
  if (shift > 64) {  // sig < 2^64 <= half
    q = 0;
    cmp_half = -1;
  } else {
    const unsigned __int128 s = sig, one = 1;
    const unsigned __int128 rest = s & ((one << shift) - 1), half = one << (shift - 1);
    q = (uint64_t)(s >> shift);
    cmp_half = rest < half ? -1 : rest > half;
    inexact = rest != 0;
  }
  switch (r) {
    case VMI_RINT: return q + (cmp_half > 0 || (cmp_half == 0 && (q & 1)));
    case VMI_AWAY: return q + (cmp_half >= 0 && inexact);
    case VMI_FLOOR: return q + (neg && inexact);
    case VMI_CEIL: return q + (!neg && inexact);
    case VMI_TRUNC: return q;
    case VMI_ODD: return q | inexact;
    default: fail("vcvt: rounding mode %d is not modelled", (int)r);
  }
}

// The code of |sig * 2^exp2| rounded to the format's grid (subnormals kept: ASSUMPTION,
// no page mentions flushing in a conversion); it may exceed max_mag.
inline uint64_t round_magnitude(bool neg, uint64_t sig, int exp2, const Format &f, VmiRound r) {
  if (sig == 0) return 0;
  const int top = 63 - __builtin_clzll(sig) + exp2;  // exponent of the leading bit
  const int emin = 1 - f.bias;
  const int ulp = (top < emin ? emin : top) - f.man;  // exponent of the last kept bit
  uint64_t q = round_shift(neg, sig, ulp - exp2, r);
  const uint64_t hidden = 1ull << f.man;
  if (q < hidden) return q;  // subnormal or zero
  int e = ulp + f.man + f.bias;
  if (q >= 2 * hidden) {  // rounding carried into the next binade
    q >>= 1;
    ++e;
  }
  return ((uint64_t)e << f.man) | (q - hidden);
}

// Float to float [CAST table 4]: saturating, NaN gives 0 and anything past the largest
// finite value (inf included) gives it, signed (CTRL[50] at its reset value: ASSUMPTION,
// no kernel sets it); not saturating, NaN gives NaN (`nan`), inf gives inf, a finite
// overflow rounds as IEEE 754 does for the direction, and e4m3fn, which has no inf, gives
// S.1111.111. e2m1 has neither: NaN gives 0, inf and overflow the signed largest value.
inline uint32_t encode(const Decoded &d, const Format &f, VmiRound r, bool saturate) {
  const int width = 1 + f.exp + f.man;
  const uint32_t sign = d.neg ? 1u << (width - 1) : 0;
  if (d.nan) return saturate || !f.nan ? 0 : f.nan;
  const uint64_t mag = d.inf ? UINT64_MAX : round_magnitude(d.neg, d.sig, d.exp2, f, r);
  if (mag <= f.max_mag) return sign | (uint32_t)mag;
  if (saturate || !f.nan) return sign | f.max_mag;
  if (!f.ieee) return sign | f.nan;
  const bool to_inf = d.inf || r == VMI_RINT || r == VMI_AWAY || (r == VMI_FLOOR && d.neg) || (r == VMI_CEIL && !d.neg);
  return sign | (to_inf ? ((1u << f.exp) - 1) << f.man : f.max_mag);
}

// Float to int32 [CAST table 4]: NaN gives 0, inf the type's extreme; past the range,
// saturating gives the extreme, not saturating the low 32 bits of the rounded integer.
inline int32_t float_to_int32(const Decoded &d, VmiRound r, bool saturate) {
  if (d.nan) return 0;
  if (d.inf) return d.neg ? INT32_MIN : INT32_MAX;
  const bool huge = d.sig && 63 - __builtin_clzll(d.sig) + d.exp2 >= 63;
  const uint64_t q = d.exp2 >= 64 ? 0 : d.exp2 >= 0 ? d.sig << d.exp2 : round_shift(d.neg, d.sig, -d.exp2, r);
  if (saturate && (huge || q > (d.neg ? 0x80000000ull : 0x7FFFFFFFull))) return d.neg ? INT32_MIN : INT32_MAX;
  const uint32_t low = (uint32_t)q;
  return (int32_t)(d.neg ? 0u - low : low);
}

template <class T>
inline Decoded decode_lane(T x) {
  if constexpr (std::is_same_v<T, float>) return decode(bits_of(x), F32);
  else if constexpr (std::is_same_v<T, bfloat16_t>) return decode(x.bits, BF16);
  else if constexpr (std::is_same_v<T, half>) return decode(x.bits, F16);
  else if constexpr (std::is_same_v<T, fp8_e4_t>) return decode(x.bits, E4M3);
  else if constexpr (std::is_same_v<T, fp8_e5_t>) return decode(x.bits, E5M2);
  else {
    static_assert(std::is_same_v<T, int32_t>);
    return Decoded{x < 0, false, false, x < 0 ? 0ull - (uint64_t)(int64_t)x : (uint64_t)x, 0};
  }
}

template <class T>
inline T encode_lane(const Decoded &d, VmiRound r, bool saturate) {
  if constexpr (std::is_same_v<T, float>) return float_of(encode(d, F32, r, saturate));
  else if constexpr (std::is_same_v<T, bfloat16_t>) return T{(uint16_t)encode(d, BF16, r, saturate)};
  else if constexpr (std::is_same_v<T, half>) return T{(uint16_t)encode(d, F16, r, saturate)};
  else if constexpr (std::is_same_v<T, fp8_e4_t>) return T{(uint8_t)encode(d, E4M3, r, saturate)};
  else if constexpr (std::is_same_v<T, fp8_e5_t>) return T{(uint8_t)encode(d, E5M2, r, saturate)};
  else {
    static_assert(std::is_same_v<T, int32_t>);
    return float_to_int32(d, r, saturate);
  }
}

template <class D, class S>
inline D convert_lane(S x, VmiRound r, bool saturate) {
  if constexpr (std::is_same_v<S, bfloat16_t> && std::is_same_v<D, float>)
    return float_of((uint32_t)x.bits << 16);  // bf16 is the top half of binary32: exact, NaN payloads too
  else return encode_lane<D>(decode_lane(x), r, saturate);
}

// The pairs of [CAST tables 6-8] this model implements: how many PART_* positions the
// narrow side has, which rounding modes the pair takes, and whether it takes RS_*.
struct CvtSpec {
  bool modelled;
  int parts;
  unsigned rounds;  // bit per VmiRound
  bool sat;
};
constexpr unsigned ROUNDS = 1u << VMI_RINT | 1u << VMI_AWAY | 1u << VMI_FLOOR | 1u << VMI_CEIL | 1u << VMI_TRUNC;

template <class D, class S>
constexpr CvtSpec cvt_spec() {
  constexpr bool f32_src = std::is_same_v<S, float>, f32_dst = std::is_same_v<D, float>;
  constexpr bool bf16_src = std::is_same_v<S, bfloat16_t>, bf16_dst = std::is_same_v<D, bfloat16_t>;
  if (f32_src && bf16_dst) return {true, 2, ROUNDS, true};
  if (f32_src && std::is_same_v<D, half>) return {true, 2, ROUNDS | 1u << VMI_ODD, true};
  if (f32_src && (std::is_same_v<D, fp8_e4_t> || std::is_same_v<D, fp8_e5_t>)) return {true, 4, 1u << VMI_RINT, true};
  if (f32_src && std::is_same_v<D, int32_t>) return {true, 1, ROUNDS, true};
  if (f32_dst && (bf16_src || std::is_same_v<S, half>)) return {true, 2, 0, false};
  if (f32_dst && (std::is_same_v<S, fp8_e4_t> || std::is_same_v<S, fp8_e5_t>)) return {true, 4, 0, false};
  if (f32_dst && std::is_same_v<S, int32_t>) return {true, 1, ROUNDS, false};
  if (bf16_src && std::is_same_v<D, half>) return {true, 1, ROUNDS, true};
  if (std::is_same_v<S, half> && bf16_dst) return {true, 1, ROUNDS, false};
  if (bf16_src && std::is_same_v<D, int32_t>) return {true, 2, ROUNDS, true};
  if (bf16_src && std::is_same_v<D, float4_e2m1x2_t>) return {true, 4, ROUNDS, false};
  if (std::is_same_v<S, float4_e2m1x2_t> && bf16_dst) return {true, 4, 0, false};
  return {false, 0, 0, false};
}

struct CvtControls {
  int round = -1, sat = -1, part = -1, mode = -1;
};

template <class C>
constexpr void take_control(CvtControls &c) {
  using V = typename C::value_type;
  if constexpr (std::is_same_v<V, VmiRound>) c.round = C::value;
  else if constexpr (std::is_same_v<V, VmiSat>) c.sat = C::value;
  else if constexpr (std::is_same_v<V, VmiPart>) c.part = C::value;
  else if constexpr (std::is_same_v<V, VmiMode>) c.mode = C::value;
  else static_assert(std::is_same_v<V, void>, "vcvt: unknown control operand");
}

template <class... C>
constexpr CvtControls cvt_controls() {
  CvtControls c;
  (take_control<C>(c), ...);
  return c;
}

inline uint8_t e2m1_of(bfloat16_t x, VmiRound r) { return (uint8_t)encode(decode(x.bits, BF16), E2M1, r, false); }
inline bfloat16_t bf16_of_e2m1(uint8_t code) {
  return bfloat16_t{(uint16_t)encode(decode(code, E2M1), BF16, VMI_RINT, false)};
}

}  // namespace ascend_sim

// vcvt [CAST]: converts the active source elements; the mask is read per source element
// (at its lowest byte) and every destination element the conversion does not write is 0.
// Narrowing by r writes source element j to destination element part + r*j; widening
// reads source element part + r*j into destination element j [LAY]. e2m1x2 <-> bf16
// moves element pairs: bf16 elements 2k, 2k+1 (the even one's mask bit) <-> byte
// part + 4k, the even element in the low nibble.
template <class D, class S, class... C>
inline void vcvt(ascend_sim::vreg<D> &dst, ascend_sim::vreg<S> src, vector_bool mask, C...) {
  using namespace ascend_sim;
  constexpr CvtSpec spec = cvt_spec<D, S>();
  constexpr CvtControls c = cvt_controls<C...>();
  static_assert(spec.modelled, "vcvt: this pair of types is not modelled");
  static_assert(c.mode == VMI_ZEROING, "vcvt: only MODE_ZEROING is documented for conversions");
  static_assert(spec.parts == 1 ? c.part < 0 : c.part >= 0 && c.part < spec.parts,
                "vcvt: PART_* does not fit the pair");
  static_assert(spec.rounds ? c.round >= 0 && (spec.rounds >> c.round & 1) : c.round < 0,
                "vcvt: rounding mode not available for the pair");
  static_assert(spec.sat == (c.sat >= 0), "vcvt: RS_* does not fit the pair");
  count_instruction();
  const VmiRound round = c.round < 0 ? VMI_RINT : (VmiRound)c.round;
  const bool saturate = c.sat == VMI_SAT;
  const int part = c.part < 0 ? 0 : c.part;
  vreg<D> out{};
  if constexpr (std::is_same_v<D, float4_e2m1x2_t>) {
    for (int k = 0; k < VL / 4; ++k)
      if (mask.bit[4 * k])
        out.lane[part + 4 * k].bits =
            (uint8_t)(e2m1_of(src.lane[2 * k], round) | e2m1_of(src.lane[2 * k + 1], round) << 4);
  } else if constexpr (std::is_same_v<S, float4_e2m1x2_t>) {
    for (int k = 0; k < VL / 4; ++k) {
      const int byte = part + 4 * k;
      if (!mask.bit[byte]) continue;
      out.lane[2 * k] = bf16_of_e2m1(src.lane[byte].bits & 0xF);
      out.lane[2 * k + 1] = bf16_of_e2m1(src.lane[byte].bits >> 4);
    }
  } else if constexpr (sizeof(S) >= sizeof(D)) {
    constexpr int r = sizeof(S) / sizeof(D);
    for (int j = 0; j < vreg<S>::lanes; ++j)
      if (active<S>(mask, j)) out.lane[part + r * j] = convert_lane<D>(src.lane[j], round, saturate);
  } else {
    constexpr int r = sizeof(D) / sizeof(S);
    for (int j = 0; j < vreg<D>::lanes; ++j) {
      const int k = part + r * j;
      if (active<S>(mask, k)) out.lane[j] = convert_lane<D>(src.lane[k], round, saturate);
    }
  }
  dst = out;
}
