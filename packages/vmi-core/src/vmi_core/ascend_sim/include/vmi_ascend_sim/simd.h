// vmi ascend-sim: the SIMD vector unit (registers, predicates, vector loads and
// stores, arithmetic, compares, reductions) as the arch-3510 C API `asc_*` and the
// CCE intrinsics TileLang's <tl_templates/ascend/simd_inst.h> calls directly. That
// header itself is compiled unmodified on top of this model (see `c_api/asc_simd.h`),
// so TileLang's wrappers (merging through asc_select, the 0-ulp division, ...) run too.
// Number-format conversions (`vcvt`) are in simd_cvt.h.
//
// Sources (cited beside each model below):
//  [R]    asc-devkit docs/zh/api/SIMD-API/C-API/reg/<group>/<page>.md, the arch-3510
//         register C API pages (asc_add, asc_reduce_max, asc_loadalign_unpack, ...);
//  [RC]   asc-devkit docs/zh/api/SIMD-API/基础API/Reg矢量计算/<group>/<page>.md, the same
//         instructions as C++ API pages; they hold the tables the C pages leave out
//         (load/store distributions with their alignments, reduction special values);
//  [I]    asc-devkit impl/c_api/instr_impl/npu_arch_3510: each asc_* is one CCE
//         intrinsic with MODE_ZEROING (asc_add -> vadd(dst, a, b, mask, MODE_ZEROING));
//  [TL]   tilelang 0.1.15 src/tl_templates/ascend/simd_inst.h and codegen_ascend.cc
//         (which calls are emitted, MODE_MERGING emitted as the CCE intrinsic).
// Open points are ASSUMPTIONS, listed in vmi-core's README ("ascend-sim assumptions").
//
// A vector register is 256 bytes: 64 lanes of 32 bits, 128 of 16, 256 of 8 [R
// reg_data_types/data_type_definition]. A predicate is 256 bits, one per register
// byte: a lane of a b16/b32 operation is active when the bit of its lowest byte is set
// [RC 寄存器数据类型/MaskReg]. An intrinsic or mode that is not modelled does not
// compile: templates have no matching overload or fail a static_assert, and the few
// non-template wrappers of simd_inst.h reach declarations marked VMI_UNMODELLED, a
// compile error as soon as a kernel calls them.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "asc_api.h"

#define __simd_vf__
#define __simd_callee__
#define __NPU_ARCH__ 3510  // simd_inst.h declares the arch-3510 register types under this

#define VMI_UNMODELLED(name) __attribute__((error(name " is not modelled by ascend-sim")))

// ---- element types -------------------------------------------------------------
// Storage formats without host arithmetic: only loads, stores, selects and vcvt touch them.
#define VMI_ASCEND_SIM_STORAGE_TYPE(NAME, BITS) \
  struct NAME {                                 \
    BITS bits;                                  \
  };
VMI_ASCEND_SIM_STORAGE_TYPE(bfloat16_t, uint16_t)
VMI_ASCEND_SIM_STORAGE_TYPE(half, uint16_t)
VMI_ASCEND_SIM_STORAGE_TYPE(fp8_e4_t, uint8_t)
VMI_ASCEND_SIM_STORAGE_TYPE(float8_e4m3_t, uint8_t)  // CANN's fp8_e4m3fn_t; simd_inst.h's vec<> does not map it
VMI_ASCEND_SIM_STORAGE_TYPE(fp8_e5_t, uint8_t)
VMI_ASCEND_SIM_STORAGE_TYPE(float8_e5m2_t, uint8_t)
VMI_ASCEND_SIM_STORAGE_TYPE(float8_e8m0_t, uint8_t)
VMI_ASCEND_SIM_STORAGE_TYPE(float4_e2m1x2_t, uint8_t)  // two e2m1 codes, element 0 in the low nibble
VMI_ASCEND_SIM_STORAGE_TYPE(float4_e1m2x2_t, uint8_t)
#undef VMI_ASCEND_SIM_STORAGE_TYPE

// ---- registers -----------------------------------------------------------------
namespace ascend_sim {

constexpr int VL = 256;  // bytes in a vector register [R reg_data_types/data_type_definition]

template <class T>
struct vreg {
  static constexpr int lanes = VL / (int)sizeof(T);
  T lane[lanes];
};

}  // namespace ascend_sim

struct vector_bool {
  uint8_t bit[ascend_sim::VL];  // 0 or 1: bit i covers register byte i
};

using vector_f32 = ascend_sim::vreg<float>;
using vector_s32 = ascend_sim::vreg<int32_t>;
using vector_u32 = ascend_sim::vreg<uint32_t>;
using vector_s16 = ascend_sim::vreg<int16_t>;
using vector_u16 = ascend_sim::vreg<uint16_t>;
using vector_s8 = ascend_sim::vreg<int8_t>;
using vector_u8 = ascend_sim::vreg<uint8_t>;
using vector_s64 = ascend_sim::vreg<int64_t>;
using vector_u64 = ascend_sim::vreg<uint64_t>;
using vector_f16 = ascend_sim::vreg<half>;
using vector_bf16 = ascend_sim::vreg<bfloat16_t>;
using vector_f8e4m3 = ascend_sim::vreg<fp8_e4_t>;
using vector_f8e5m2 = ascend_sim::vreg<fp8_e5_t>;
using vector_f8e8m0 = ascend_sim::vreg<float8_e8m0_t>;
using vector_f4e2m1x2 = ascend_sim::vreg<float4_e2m1x2_t>;
using vector_f4e1m2x2 = ascend_sim::vreg<float4_e1m2x2_t>;
// The C API pages' names for the same registers.
using vector_float = vector_f32;
using vector_int32_t = vector_s32;
using vector_uint32_t = vector_u32;
using vector_int16_t = vector_s16;
using vector_uint16_t = vector_u16;
using vector_int8_t = vector_s8;
using vector_uint8_t = vector_u8;
using vector_half = vector_f16;
using vector_bfloat16_t = vector_bf16;
using vector_fp8_e4m3fn_t = vector_f8e4m3;

// ---- control operands ------------------------------------------------------------
// The CCE control words are distinct types, so `if constexpr (mode == MODE_ZEROING)` in
// simd_inst.h is a constant expression and vcvt can read its controls at compile time.
enum VmiMode { VMI_ZEROING, VMI_MERGING, VMI_STORED };
enum VmiOrder { VMI_INC, VMI_DEC };
enum VmiPart { VMI_P0, VMI_P1, VMI_P2, VMI_P3 };
enum VmiHalf { VMI_LOWER, VMI_HIGHER };
enum VmiPos { VMI_LOWEST, VMI_HIGHEST };
enum VmiBin { VMI_BIN0, VMI_BIN1 };
enum VmiRound { VMI_RINT, VMI_AWAY, VMI_FLOOR, VMI_CEIL, VMI_TRUNC, VMI_ODD, VMI_HYBRID };
enum VmiSat { VMI_SAT, VMI_NO_SAT };
enum VmiDist { VMI_DINTLV_B8, VMI_DINTLV_B16, VMI_DINTLV_B32 };

#define VMI_ASCEND_SIM_CONTROL(NAME, VALUE) inline constexpr std::integral_constant<decltype(VALUE), VALUE> NAME{};
VMI_ASCEND_SIM_CONTROL(MODE_ZEROING, VMI_ZEROING)
VMI_ASCEND_SIM_CONTROL(MODE_MERGING, VMI_MERGING)
VMI_ASCEND_SIM_CONTROL(MODE_STORED, VMI_STORED)
VMI_ASCEND_SIM_CONTROL(INC_ORDER, VMI_INC)
VMI_ASCEND_SIM_CONTROL(DEC_ORDER, VMI_DEC)
VMI_ASCEND_SIM_CONTROL(PART_EVEN, VMI_P0)
VMI_ASCEND_SIM_CONTROL(PART_ODD, VMI_P1)
VMI_ASCEND_SIM_CONTROL(PART_P0, VMI_P0)
VMI_ASCEND_SIM_CONTROL(PART_P1, VMI_P1)
VMI_ASCEND_SIM_CONTROL(PART_P2, VMI_P2)
VMI_ASCEND_SIM_CONTROL(PART_P3, VMI_P3)
VMI_ASCEND_SIM_CONTROL(LOWER, VMI_LOWER)
VMI_ASCEND_SIM_CONTROL(HIGHER, VMI_HIGHER)
VMI_ASCEND_SIM_CONTROL(POS_LOWEST, VMI_LOWEST)
VMI_ASCEND_SIM_CONTROL(POS_HIGHEST, VMI_HIGHEST)
VMI_ASCEND_SIM_CONTROL(Bin_N0, VMI_BIN0)
VMI_ASCEND_SIM_CONTROL(Bin_N1, VMI_BIN1)
VMI_ASCEND_SIM_CONTROL(ROUND_R, VMI_RINT)
VMI_ASCEND_SIM_CONTROL(ROUND_A, VMI_AWAY)
VMI_ASCEND_SIM_CONTROL(ROUND_F, VMI_FLOOR)
VMI_ASCEND_SIM_CONTROL(ROUND_C, VMI_CEIL)
VMI_ASCEND_SIM_CONTROL(ROUND_Z, VMI_TRUNC)
VMI_ASCEND_SIM_CONTROL(ROUND_O, VMI_ODD)
VMI_ASCEND_SIM_CONTROL(ROUND_H, VMI_HYBRID)
VMI_ASCEND_SIM_CONTROL(RS_ENABLE, VMI_SAT)
VMI_ASCEND_SIM_CONTROL(RS_DISABLE, VMI_NO_SAT)
VMI_ASCEND_SIM_CONTROL(DINTLV_B8, VMI_DINTLV_B8)  // simd_inst::vld_x2 names them; the element type decides
VMI_ASCEND_SIM_CONTROL(DINTLV_B16, VMI_DINTLV_B16)
VMI_ASCEND_SIM_CONTROL(DINTLV_B32, VMI_DINTLV_B32)
#undef VMI_ASCEND_SIM_CONTROL

// Predicate patterns, in the order of [R reg_data_types/asc_create_mask].
enum Pat { PAT_ALL, PAT_VL1, PAT_VL2, PAT_VL3, PAT_VL4, PAT_VL8, PAT_VL16, PAT_VL32, PAT_VL64, PAT_VL128, PAT_M3,
           PAT_M4, PAT_H, PAT_Q, PAT_ALLF = 15 };

// Memory barrier kinds of [R sync_control/asc_mem_bar].
enum MEM_TYPE { VV_ALL, VST_VLD, VLD_VST, VST_VST, VS_ALL, VST_LD, VLD_ST, VST_ST, SV_ALL, ST_VLD, LD_VST, ST_VST,
                SS_ALL, ST_LD, LD_ST, ST_ST };

namespace ascend_sim {

template <class T>
struct same {
  using type = T;
};
template <class T>
using same_t = typename same<T>::type;  // a scalar operand converted to the lane type, not deduced from it

template <class T>
constexpr bool is_int_lane = std::is_integral_v<T> && sizeof(T) <= 4;
template <class T>
constexpr bool is_alu_lane = is_int_lane<T> || std::is_same_v<T, float>;
template <class T>
constexpr bool is_signed_lane = is_alu_lane<T> && std::is_signed_v<T>;
// The lane types the rearranging instructions (asc_intlv, asc_deintlv, register
// asc_gather) list: 8-, 16- and 32-bit integers and floats, no FP4 pairs.
template <class T>
constexpr bool is_data_lane = is_alu_lane<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t> ||
                              std::is_same_v<T, fp8_e4_t> || std::is_same_v<T, fp8_e5_t> ||
                              std::is_same_v<T, float8_e8m0_t>;
// The unsigned integer of a lane's width: the index lanes of gathers and scatters.
template <class T>
using index_of = std::conditional_t<sizeof(T) == 1, uint8_t, std::conditional_t<sizeof(T) == 2, uint16_t, uint32_t>>;

template <class T>
inline bool active(const vector_bool &mask, int lane) {
  return mask.bit[lane * (int)sizeof(T)];
}

inline uint32_t bits_of(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}
inline float float_of(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

// A NaN the vector unit computes is 0x7FFFFFFF (ASSUMPTION: the value [RC 基础算术/Div]
// table 8 shows for 0/0; no page states NaN payloads for other operations).
constexpr uint32_t F32_NAN = 0x7FFFFFFF;
inline float canonical(float x) { return std::isnan(x) ? float_of(F32_NAN) : x; }

// Subnormal operands and results of the division unit are zero ([RC 基础算术/Div]
// "subnormals are flushed to zero" for the single-instruction algorithm).
inline float flush(float x) { return std::fabs(x) < 0x1p-126f ? std::copysign(0.0f, x) : x; }

// One instruction executed (the launch statistics).
inline void count_instruction() { ++L.stats.vector_instructions; }

// Per-lane result with the predicate: MODE_ZEROING writes 0 to inactive lanes [R
// arithmetic_compute/asc_add], MODE_MERGING keeps the destination's lane [TL codegen].
// Every instruction computed through it is counted here.
template <class T, class Mode, class F>
inline void lanewise(vreg<T> &dst, const vector_bool &mask, Mode, F f) {
  static_assert(Mode::value == VMI_ZEROING || Mode::value == VMI_MERGING, "this mode is not modelled");
  count_instruction();
  vreg<T> out;
  for (int i = 0; i < vreg<T>::lanes; ++i)
    out.lane[i] = active<T>(mask, i) ? f(i) : Mode::value == VMI_MERGING ? dst.lane[i] : T{};
  dst = out;
}

// Integer arithmetic wraps: computed on the unsigned twin of the lane type.
template <class T>
inline T wrap_add(T a, T b) { return (T)((std::make_unsigned_t<T>)a + (std::make_unsigned_t<T>)b); }
template <class T>
inline T wrap_sub(T a, T b) { return (T)((std::make_unsigned_t<T>)a - (std::make_unsigned_t<T>)b); }
template <class T>
inline T wrap_mul(T a, T b) {
  using U = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
  return (T)(U)((U)(std::make_unsigned_t<T>)a * (U)(std::make_unsigned_t<T>)b);
}

template <class T>
inline T add(T a, T b) {
  if constexpr (std::is_same_v<T, float>) return canonical(a + b);
  else return wrap_add(a, b);
}
template <class T>
inline T sub(T a, T b) {
  if constexpr (std::is_same_v<T, float>) return canonical(a - b);
  else return wrap_sub(a, b);
}
template <class T>
inline T mul(T a, T b) {
  if constexpr (std::is_same_v<T, float>) return canonical(a * b);
  else return wrap_mul(a, b);
}
// max/min: a NaN operand gives NaN (ASSUMPTION, as [RC 归约计算/Reduce] states for the
// reductions); max(-0, +0) = +0 and min(-0, +0) = -0 [RC 基础算术/Max, Min].
template <class T>
inline T max(T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    if (std::isnan(a) || std::isnan(b)) return float_of(F32_NAN);
    if (a == b) return std::signbit(a) ? b : a;
  }
  return a > b ? a : b;
}
template <class T>
inline T min(T a, T b) {
  if constexpr (std::is_same_v<T, float>) {
    if (std::isnan(a) || std::isnan(b)) return float_of(F32_NAN);
    if (a == b) return std::signbit(a) ? a : b;
  }
  return a < b ? a : b;
}

// Float abs and neg act on the sign bit only (ASSUMPTION: IEEE abs/negate, so NaN
// payloads pass); integer abs and neg wrap (the most negative value stays).
template <class T>
inline T abs(T a) {
  if constexpr (std::is_same_v<T, float>) return std::fabs(a);
  else return a < 0 ? wrap_sub((T)0, a) : a;
}
template <class T>
inline T neg(T a) {
  if constexpr (std::is_same_v<T, float>) return -a;
  else return wrap_sub((T)0, a);
}

// Shifts [R logic_compute/asc_shiftleft, asc_shiftright]: unsigned lanes shift
// logically, signed lanes arithmetically; an arithmetic left shift keeps the sign bit
// and drops the bit below it; a shift past the width gives 0 (-1 for a negative value
// shifted right). A negative amount is undefined: the lane gets arbitrary bits, so a
// kernel that uses them shows wrong data (one that discards them, e.g. through vsel,
// is fine).
template <class T>
inline T unspecified() {
  return (T)random_u64();
}
template <class T>
inline T shift_left(T a, int64_t s) {
  constexpr int W = 8 * sizeof(T);
  using U = std::make_unsigned_t<T>;
  if (s < 0) return unspecified<T>();
  if (s > W) return 0;
  const uint64_t shifted = s == W ? 0 : (uint64_t)(U)a << s;
  if constexpr (std::is_signed_v<T>) {
    const U sign = (U)1 << (W - 1);
    return (T)(U)(((U)a & sign) | ((U)shifted & (U)(sign - 1)));
  } else {
    return (T)(U)shifted;
  }
}
template <class T>
inline T shift_right(T a, int64_t s) {
  constexpr int W = 8 * sizeof(T);
  if (s < 0) return unspecified<T>();
  if (s >= W) return std::is_signed_v<T> && a < 0 ? (T)-1 : (T)0;
  return (T)(a >> s);  // arithmetic for signed lanes (C++20 semantics, which g++ implements)
}

// ---- the SIMD region ---------------------------------------------------------------
// A `__simd_vf__` function runs on the V pipe (prepare_source turns it into a launcher
// that captures its arguments at issue). Inside it the vector instructions run in
// program order, except that a vector load may overtake a vector store to the same UB
// bytes unless an asc_mem_bar(VST_VLD) (or VV_ALL) separates them [R
// sync_control/asc_mem_bar]: such a load is an error here. The model does not see
// registers, so it also reports a pair the hardware would order through a shared
// register; scalar UB accesses inside the region are not tracked.
struct SimdRegion {
  const char *name = nullptr;   // the running vector function, null outside one
  std::vector<uint8_t> stored;  // per UB byte: written by a vector store since the last barrier
  std::vector<std::pair<int64_t, int64_t>> ranges;  // where `stored` is set
};

inline SimdRegion V;

inline void barrier_stores() {
  for (auto &r : V.ranges) memset(V.stored.data() + r.first, 0, (size_t)(r.second - r.first));
  V.ranges.clear();
}

inline void run_simd_vf(const char *name, const std::function<void()> &body) {
  struct Region {  // the region ends (stores visible, no function running) also when a check fails
    explicit Region(const char *n) {
      if (V.stored.size() != (size_t)L.ub_alloc) V.stored.assign((size_t)L.ub_alloc, 0);
      barrier_stores();
      V.name = n;
      L.region = REGION_SIMD;
      ++L.stats.simd_regions;
    }
    ~Region() {
      barrier_stores();
      V.name = nullptr;
      L.region = REGION_SCALAR;
    }
  } region(name);
  body();
}

// The message is formatted only when a check fails: gathers check every lane.
inline void check_vector_access(const char *what, const char *kind, int64_t at, int64_t bytes, int64_t align) {
  if (V.name && at >= 0 && at + bytes <= L.ub_alloc && at % align == 0) return;
  char where[160];
  snprintf(where, sizeof where, "%s (vector %s at UB byte %lld)", what, kind, (long long)at);
  if (!V.name) fail("%s outside a __simd_vf__ function", where);
  check_ub(at, bytes, align, where);
}

// A vector read of UB bytes [at, at + bytes) (bounds checked already): none of them may
// be a vector store's since the last mem_bar.
inline void check_stored(const char *what, const char *kind, int64_t at, int64_t bytes) {
  for (int64_t b = at; b < at + bytes; ++b)
    if (V.stored[b])
      fail("%s (vector %s at UB byte %lld): reads UB byte %lld, which a vector store wrote with no "
           "asc_mem_bar(VST_VLD) in between", what, kind, (long long)at, (long long)b);
}

// A vector load of the `bytes` UB bytes at byte offset `at`, aligned as its
// distribution requires: one load instruction.
inline const uint8_t *vector_read(const char *what, int64_t at, int64_t bytes, int64_t align) {
  check_vector_access(what, "load", at, bytes, align);
  check_stored(what, "load", at, bytes);
  count_instruction();
  ++L.stats.vector_loads;
  return L.ub + at;
}

// Bytes a vector store writes (checked already): visible to vector loads after a mem_bar.
inline void store_bytes(int64_t at, const void *src, size_t n) {
  memcpy(L.ub + at, src, n);
  memset(V.stored.data() + at, 1, n);
  V.ranges.emplace_back(at, at + (int64_t)n);
}

// A vector store's footprint is checked whole, whatever the mask (ASSUMPTION); `put`
// then writes the bytes it stores. One store instruction.
struct VectorStore {
  int64_t at;

  VectorStore(const char *what, int64_t at_, int64_t bytes, int64_t align) : at(at_) {
    check_vector_access(what, "store", at, bytes, align);
    count_instruction();
    ++L.stats.vector_stores;
  }
  void put(int64_t byte, const void *src, size_t n) const { store_bytes(at + byte, src, n); }
};

template <class T>
inline int64_t address(ub_ptr<T> base, int32_t offset) {  // offsets count elements (ASSUMPTION)
  return base.offset + (int64_t)offset * (int64_t)sizeof(T);
}

}  // namespace ascend_sim

namespace ascend_sim {

// A `__simd_vf__` call as the kernel's scalar code issues it [TL codegen: direct call].
template <class Body>
inline void simd_vf_call(const char *name, Body body) {
  issue(PIPE_V, Op{Op::WORK, 0, 0, 0, [=] { run_simd_vf(name, body); }, std::string("__simd_vf__ ") + name});
}

// ---- predicates ----------------------------------------------------------------------
// pset_bN [R reg_data_types/asc_create_mask]: the pattern's lanes of an N-bit type;
// only the lowest bit of each lane is set (ASSUMPTION: the page says only that bit
// counts). VLk past the lane count selects every lane (ASSUMPTION).
inline vector_bool predicate_pattern(int width_bytes, Pat pattern) {
  count_instruction();
  const int lanes = VL / width_bytes;
  vector_bool m{};
  for (int i = 0; i < lanes; ++i) {
    bool on;
    switch (pattern) {
      case PAT_ALL: on = true; break;
      case PAT_VL1: on = i < 1; break;
      case PAT_VL2: on = i < 2; break;
      case PAT_VL3: on = i < 3; break;
      case PAT_VL4: on = i < 4; break;
      case PAT_VL8: on = i < 8; break;
      case PAT_VL16: on = i < 16; break;
      case PAT_VL32: on = i < 32; break;
      case PAT_VL64: on = i < 64; break;
      case PAT_VL128: on = i < 128; break;
      case PAT_M3: on = i % 3 == 0; break;
      case PAT_M4: on = i % 4 == 0; break;
      case PAT_H: on = i < lanes / 2; break;
      case PAT_Q: on = i < lanes / 4; break;
      case PAT_ALLF: on = false; break;
      default: fail("asc_create_mask: pattern %d is not defined", (int)pattern);
    }
    m.bit[i * width_bytes] = on;
  }
  return m;
}

// asc_update_mask_bN(count) [R reg_data_types/asc_update_mask]: lanes [0, count), and
// count drops by the lane count.
inline vector_bool update_mask(int width_bytes, uint32_t &count) {
  count_instruction();
  const uint32_t lanes = VL / width_bytes;
  vector_bool m{};
  for (uint32_t i = 0; i < lanes && i < count; ++i) m.bit[i * width_bytes] = 1;
  count = count < lanes ? 0 : count - lanes;
  return m;
}

// Predicate loads and stores [RC Reg数据搬入/MaskReg搬入（LoadAlign）, Reg数据搬出/
// MaskReg搬出（StoreAlign）]: NORM moves 32 bytes (32-byte aligned); US reads 16 bytes
// and repeats each bit twice; DS reads 64 bytes and keeps every other bit; PACK stores
// every other bit as 16 bytes. Bit i is bit i % 8 of byte i / 8 (ASSUMPTION).
// Predicate bit i is source bit i * half_steps / 2: half_steps 2 (NORM), 1 (US), 4 (DS).
inline void predicate_load(vector_bool &dst, ub_ptr<uint32_t> src, int32_t offset, int half_steps, int bytes,
                           int align, const char *what) {
  const uint8_t *p = vector_read(what, address(src, offset), bytes, align);
  for (int i = 0; i < VL; ++i) {
    const int b = i * half_steps / 2;
    dst.bit[i] = (p[b / 8] >> (b % 8)) & 1;
  }
}
// Stored bit b is predicate bit b * step: step 1 (NORM), 2 (PACK).
inline void predicate_store(ub_ptr<uint32_t> dst, const vector_bool &src, int32_t offset, int step, int bytes,
                            const char *what) {
  const VectorStore store(what, address(dst, offset), bytes, bytes);
  for (int byte = 0; byte < bytes; ++byte) {
    uint8_t packed = 0;
    for (int b = 0; b < 8; ++b) packed |= (uint8_t)(src.bit[(8 * byte + b) * step] << b);
    store.put(byte, &packed, 1);
  }
}

}  // namespace ascend_sim

inline vector_bool pset_b8(Pat pattern) { return ascend_sim::predicate_pattern(1, pattern); }
inline vector_bool pset_b16(Pat pattern) { return ascend_sim::predicate_pattern(2, pattern); }
inline vector_bool pset_b32(Pat pattern) { return ascend_sim::predicate_pattern(4, pattern); }
#define asc_create_mask_b8 pset_b8  // [R] reg_vector.h defines these names as the CCE ones
#define asc_create_mask_b16 pset_b16
#define asc_create_mask_b32 pset_b32

inline vector_bool asc_update_mask_b8(uint32_t &count) { return ascend_sim::update_mask(1, count); }
inline vector_bool asc_update_mask_b16(uint32_t &count) { return ascend_sim::update_mask(2, count); }
inline vector_bool asc_update_mask_b32(uint32_t &count) { return ascend_sim::update_mask(4, count); }

// Predicate logic [R logic_compute/asc_and, asc_or, asc_xor, asc_not]: bit by bit, bits
// the mask clears are 0; asc_select takes src0's bit where the mask is set [RC
// MaskReg计算/Select].
#define VMI_ASCEND_SIM_PREDICATE_OP(NAME, EXPR)                                                    \
  inline void NAME(vector_bool &dst, vector_bool a, vector_bool b, vector_bool mask) {              \
    ascend_sim::count_instruction();                                                                \
    for (int i = 0; i < ascend_sim::VL; ++i) dst.bit[i] = (uint8_t)((EXPR) & mask.bit[i]);         \
  }
VMI_ASCEND_SIM_PREDICATE_OP(asc_and, a.bit[i] & b.bit[i])
VMI_ASCEND_SIM_PREDICATE_OP(asc_or, a.bit[i] | b.bit[i])
VMI_ASCEND_SIM_PREDICATE_OP(asc_xor, a.bit[i] ^ b.bit[i])
#undef VMI_ASCEND_SIM_PREDICATE_OP
inline void asc_not(vector_bool &dst, vector_bool a, vector_bool mask) {
  ascend_sim::count_instruction();
  for (int i = 0; i < ascend_sim::VL; ++i) dst.bit[i] = (uint8_t)(!a.bit[i] & mask.bit[i]);
}
inline void asc_select(vector_bool &dst, vector_bool a, vector_bool b, vector_bool mask) {
  ascend_sim::count_instruction();
  for (int i = 0; i < ascend_sim::VL; ++i) dst.bit[i] = mask.bit[i] ? a.bit[i] : b.bit[i];
}

// The predicate forms of the loads and stores [R reg_load/asc_loadalign, reg_store/asc_storealign].
inline void asc_loadalign(vector_bool &dst, ascend_sim::ub_ptr<uint32_t> src, int32_t offset) {
  ascend_sim::predicate_load(dst, src, offset, 2, 32, 32, "asc_loadalign(vector_bool)");
}
inline void asc_loadalign_upsample(vector_bool &dst, ascend_sim::ub_ptr<uint32_t> src, int32_t offset) {
  ascend_sim::predicate_load(dst, src, offset, 1, 16, 16, "asc_loadalign_upsample(vector_bool)");
}
inline void asc_loadalign_downsample(vector_bool &dst, ascend_sim::ub_ptr<uint32_t> src, int32_t offset) {
  ascend_sim::predicate_load(dst, src, offset, 4, 64, 32, "asc_loadalign_downsample(vector_bool)");
}
inline void asc_storealign(ascend_sim::ub_ptr<uint32_t> dst, vector_bool src, int32_t offset) {
  ascend_sim::predicate_store(dst, src, offset, 1, 32, "asc_storealign(vector_bool)");
}
inline void asc_storealign_pack(ascend_sim::ub_ptr<uint32_t> dst, vector_bool src, int32_t offset) {
  ascend_sim::predicate_store(dst, src, offset, 2, 16, "asc_storealign_pack(vector_bool)");
}

// Predicate rearrangements whose layouts only a figure documents.
VMI_UNMODELLED("asc_intlv_b8") void asc_intlv_b8(vector_bool &, vector_bool &, vector_bool, vector_bool);
VMI_UNMODELLED("asc_intlv_b16") void asc_intlv_b16(vector_bool &, vector_bool &, vector_bool, vector_bool);
VMI_UNMODELLED("asc_intlv_b32") void asc_intlv_b32(vector_bool &, vector_bool &, vector_bool, vector_bool);
VMI_UNMODELLED("asc_deintlv_b8") void asc_deintlv_b8(vector_bool &, vector_bool &, vector_bool, vector_bool);
VMI_UNMODELLED("asc_deintlv_b16") void asc_deintlv_b16(vector_bool &, vector_bool &, vector_bool, vector_bool);
VMI_UNMODELLED("asc_deintlv_b32") void asc_deintlv_b32(vector_bool &, vector_bool &, vector_bool, vector_bool);
VMI_UNMODELLED("asc_pack_to_high(vector_bool)") void asc_pack_to_high(vector_bool &, vector_bool);
VMI_UNMODELLED("asc_pack_to_low(vector_bool)") void asc_pack_to_low(vector_bool &, vector_bool);
VMI_UNMODELLED("asc_unpack_upper(vector_bool)") void asc_unpack_upper(vector_bool &, vector_bool);
VMI_UNMODELLED("asc_unpack_lower(vector_bool)") void asc_unpack_lower(vector_bool &, vector_bool);
VMI_UNMODELLED("asc_frequency_histogram_bin0") void asc_frequency_histogram_bin0(vector_u16 &, vector_u8, vector_bool);
VMI_UNMODELLED("asc_frequency_histogram_bin1") void asc_frequency_histogram_bin1(vector_u16 &, vector_u8, vector_bool);
VMI_UNMODELLED("asc_cumulative_histogram_bin0")
void asc_cumulative_histogram_bin0(vector_u16 &, vector_u8, vector_bool);
VMI_UNMODELLED("asc_cumulative_histogram_bin1")
void asc_cumulative_histogram_bin1(vector_u16 &, vector_u8, vector_bool);

// ---- vector loads -----------------------------------------------------------------
// [RC Reg数据搬入/连续对齐搬入（LoadAlign）] table 3: what each distribution reads and
// the UB alignment it needs. `offset` counts elements (ASSUMPTION; TileLang passes 0).
namespace ascend_sim {

template <class T>
inline void load_lanes(vreg<T> &dst, const uint8_t *p, int count, int stride, int repeat) {
  vreg<T> out{};
  for (int k = 0; k < count; ++k)
    for (int r = 0; r < repeat; ++r) memcpy(&out.lane[k * stride + r], p + k * sizeof(T), sizeof(T));
  dst = out;
}

}  // namespace ascend_sim

template <class T>
inline void asc_loadalign(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, int32_t offset) {  // NORM
  using namespace ascend_sim;
  memcpy(&dst, vector_read("asc_loadalign", address(src, offset), VL, 32), VL);
}
template <class T>
inline void asc_loadalign_brc_elem(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, int32_t offset) {  // BRC_Bn
  using namespace ascend_sim;
  const uint8_t *p = vector_read("asc_loadalign_brc_elem", address(src, offset), sizeof(T), sizeof(T));
  load_lanes(dst, p, 1, 0, vreg<T>::lanes);
}
template <class T>
inline void asc_loadalign_upsample(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, int32_t offset) {  // US_Bn
  using namespace ascend_sim;
  static_assert(sizeof(T) <= 2, "asc_loadalign_upsample: b8 and b16 only");
  const uint8_t *p = vector_read("asc_loadalign_upsample", address(src, offset), VL / 2, 32);
  load_lanes(dst, p, vreg<T>::lanes / 2, 2, 2);
}
template <class T>
inline void asc_loadalign_downsample(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, int32_t offset) {  // DS_Bn
  using namespace ascend_sim;
  static_assert(sizeof(T) <= 2, "asc_loadalign_downsample: b8 and b16 only");
  const uint8_t *p = vector_read("asc_loadalign_downsample", address(src, offset), 2 * VL, 32);
  vreg<T> out;
  for (int k = 0; k < vreg<T>::lanes; ++k) memcpy(&out.lane[k], p + 2 * k * sizeof(T), sizeof(T));
  dst = out;
}
template <class T>
inline void asc_loadalign_unpack(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, int32_t offset) {  // UNPK_Bn
  using namespace ascend_sim;  // VL/2 bytes; each element followed by a zero element
  const uint8_t *p = vector_read("asc_loadalign_unpack", address(src, offset), VL / 2, 32);
  load_lanes(dst, p, vreg<T>::lanes / 2, 2, 1);
}
template <class T>
inline void asc_loadalign_unpack4(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, int32_t offset) {  // UNPK4_B8
  using namespace ascend_sim;  // VL/4 bytes; each element followed by three zero elements
  static_assert(sizeof(T) == 1, "asc_loadalign_unpack4: b8 only");
  const uint8_t *p = vector_read("asc_loadalign_unpack4", address(src, offset), VL / 4, 32);
  load_lanes(dst, p, vreg<T>::lanes / 4, 4, 1);
}
template <class T>
inline void asc_loadalign_brc_datablock(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, int32_t offset) {  // BLK
  using namespace ascend_sim;  // one 32-byte block repeated over the register
  const uint8_t *p = vector_read("asc_loadalign_brc_datablock", address(src, offset), 32, 32);
  for (int b = 0; b < VL; b += 32) memcpy(reinterpret_cast<uint8_t *>(&dst) + b, p, 32);
}
template <class T>
inline void asc_loadalign_brc_elem2datablock(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src,
                                             int32_t offset) {  // E2B_B16/B32
  using namespace ascend_sim;  // VL/32 elements, each repeated over one 32-byte block
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "asc_loadalign_brc_elem2datablock: b16 and b32 only");
  const uint8_t *p = vector_read("asc_loadalign_brc_elem2datablock", address(src, offset), VL / 32 * sizeof(T),
                                 VL / 32 * sizeof(T));
  load_lanes(dst, p, VL / 32, 32 / sizeof(T), 32 / sizeof(T));
}
template <class T>
inline void asc_loadalign_deintlv(ascend_sim::vreg<T> &even, ascend_sim::vreg<T> &odd, ascend_sim::ub_ptr<T> src,
                                  int32_t offset = 0) {  // DINTLV_Bn: 2*VL bytes, even elements to the first
  using namespace ascend_sim;
  const uint8_t *p = vector_read("asc_loadalign_deintlv", address(src, offset), 2 * VL, 32);
  for (int k = 0; k < vreg<T>::lanes; ++k) {
    memcpy(&even.lane[k], p + 2 * k * sizeof(T), sizeof(T));
    memcpy(&odd.lane[k], p + (2 * k + 1) * sizeof(T), sizeof(T));
  }
}

// ---- vector stores ----------------------------------------------------------------
// [RC Reg数据搬出/连续对齐搬出（StoreAlign）] table 3. Inactive lanes leave their UB bytes
// as they were (ASSUMPTION for the packing stores, whose page says "valid elements are
// stored contiguously": identical for the prefix masks kernels use).
template <class T>
inline void asc_storealign(ascend_sim::ub_ptr<T> dst, ascend_sim::vreg<T> src, int32_t offset,
                           vector_bool mask) {  // NORM_Bn
  using namespace ascend_sim;
  const VectorStore store("asc_storealign", address(dst, offset), VL, 32);
  for (int i = 0; i < vreg<T>::lanes; ++i)
    if (active<T>(mask, i)) store.put(i * sizeof(T), &src.lane[i], sizeof(T));
}
template <class T>
inline void asc_storealign_1st(ascend_sim::ub_ptr<T> dst, ascend_sim::vreg<T> src, int32_t offset) {  // ONEPT_Bn
  using namespace ascend_sim;  // lane 0 only, whatever the mask
  VectorStore("asc_storealign_1st", address(dst, offset), sizeof(T), sizeof(T)).put(0, &src.lane[0], sizeof(T));
}
// PK_B16 / PK_B32: the low half of each active lane, packed [RC table 3 example].
template <class T>
inline void asc_storealign_pack(ascend_sim::ub_ptr<T> dst, ascend_sim::vreg<T> src, int32_t offset,
                                vector_bool mask) {
  using namespace ascend_sim;
  static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, uint32_t>, "asc_storealign_pack: b16 and b32 only");
  constexpr int H = sizeof(T) / 2;
  const VectorStore store("asc_storealign_pack", address(dst, offset), VL / 2, 32);
  for (int i = 0; i < vreg<T>::lanes; ++i)
    if (active<T>(mask, i)) store.put(i * H, &src.lane[i], H);  // little-endian: the low half first
}
// PK4_B32: the low byte of each active 32-bit lane, packed.
template <class T>
inline void asc_storealign_pack_quarter(ascend_sim::ub_ptr<T> dst, ascend_sim::vreg<T> src, int32_t offset,
                                        vector_bool mask) {
  using namespace ascend_sim;
  static_assert(sizeof(T) == 4, "asc_storealign_pack_quarter: b32 only");
  const VectorStore store("asc_storealign_pack_quarter", address(dst, offset), VL / 4, 32);
  for (int i = 0; i < vreg<T>::lanes; ++i)
    if (active<T>(mask, i)) store.put(i, &src.lane[i], 1);
}

// ---- gathers and scatters of UB elements ---------------------------------------------
// [R reg_load/asc_gather ("收集UB中的元素"), reg_store/asc_scatter; RC Reg数据搬入/离散搬入
// （Gather）, Reg数据搬出/离散搬出（Scatter）]: lane i reads (writes) the element `index[i]`
// elements past the base (documented unit: elements), which must be 32-byte aligned; every
// element must lie in UB (documented for gathers). Modelled for 16- and 32-bit elements
// with index lanes of their width; b8 (widened to b16 lanes, or only even lanes stored) and
// 16-bit elements with 32-bit indices do not compile. Only active lanes touch UB and each
// of their elements is checked (ASSUMPTION: the inactive lanes' indices are not used);
// inactive lanes of a gather are 0 (documented), of a scatter write nothing. A gather is a
// vector load and a scatter a vector store for asc_mem_bar.
namespace ascend_sim {

template <class T, class I>
inline void check_gather_types() {
  static_assert((sizeof(T) == 2 || sizeof(T) == 4) && std::is_same_v<I, index_of<T>>,
                "gathers and scatters of UB: element or index type not modelled");
}

}  // namespace ascend_sim

template <class T, class I>
inline void asc_gather(ascend_sim::vreg<T> &dst, ascend_sim::ub_ptr<T> src, ascend_sim::vreg<I> index,
                       vector_bool mask) {
  using namespace ascend_sim;
  check_gather_types<T, I>();
  check_vector_access("asc_gather", "gather base", src.offset, 0, 32);
  count_instruction();
  ++L.stats.vector_loads;
  vreg<T> out{};
  for (int i = 0; i < vreg<T>::lanes; ++i) {
    if (!active<T>(mask, i)) continue;
    const int64_t at = src.offset + (int64_t)index.lane[i] * (int64_t)sizeof(T);
    check_vector_access("asc_gather", "gather", at, sizeof(T), sizeof(T));
    check_stored("asc_gather", "gather", at, sizeof(T));
    memcpy(&out.lane[i], L.ub + at, sizeof(T));
  }
  dst = out;
}

// The indices of a scatter's active lanes must differ: the pages leave which one is kept
// open, so a repeated index is an error here.
template <class T, class I>
inline void asc_scatter(ascend_sim::ub_ptr<T> dst, ascend_sim::vreg<T> src, ascend_sim::vreg<I> index,
                        vector_bool mask) {
  using namespace ascend_sim;
  check_gather_types<T, I>();
  check_vector_access("asc_scatter", "scatter base", dst.offset, 0, 32);
  count_instruction();
  ++L.stats.vector_stores;
  constexpr int N = vreg<T>::lanes;
  I used[N];
  int n = 0;
  for (int i = 0; i < N; ++i)
    if (active<T>(mask, i)) used[n++] = index.lane[i];
  std::sort(used, used + n);
  for (int k = 1; k < n; ++k)
    if (used[k] == used[k - 1])
      fail("asc_scatter (vector scatter at UB byte %lld): two active lanes have the index %llu", (long long)dst.offset,
           (unsigned long long)used[k]);
  for (int i = 0; i < N; ++i) {
    if (!active<T>(mask, i)) continue;
    const int64_t at = dst.offset + (int64_t)index.lane[i] * (int64_t)sizeof(T);
    check_vector_access("asc_scatter", "scatter", at, sizeof(T), sizeof(T));
    store_bytes(at, &src.lane[i], sizeof(T));
  }
}

inline void asc_mem_bar(MEM_TYPE kind) {  // [R sync_control/asc_mem_bar]
  ++ascend_sim::L.stats.mem_bars;
  if (kind == VST_VLD || kind == VV_ALL) ascend_sim::barrier_stores();
}

// ---- arithmetic and logic ----------------------------------------------------------
// The CCE intrinsics with their mode operand; each asc_* is the intrinsic with
// MODE_ZEROING [I]. Element types outside a model's static_assert do not compile.
#define VMI_ASCEND_SIM_BINARY(CCE, CAPI, CHECK, EXPR)                                                        \
  template <class T, class Mode>                                                                             \
  inline void CCE(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, ascend_sim::vreg<T> b, vector_bool mask,   \
                  Mode mode) {                                                                               \
    static_assert(CHECK, #CCE ": element type not modelled");                                                \
    ascend_sim::lanewise(dst, mask, mode, [&](int i) { return EXPR; });                                      \
  }                                                                                                          \
  template <class T>                                                                                         \
  inline void CAPI(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, ascend_sim::vreg<T> b, vector_bool mask) { \
    CCE(dst, a, b, mask, MODE_ZEROING);                                                                      \
  }
#define VMI_ASCEND_SIM_SCALAR(CCE, CAPI, CHECK, EXPR)                                                        \
  template <class T, class Mode>                                                                             \
  inline void CCE(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, ascend_sim::same_t<T> s, vector_bool mask, \
                  Mode mode) {                                                                               \
    static_assert(CHECK, #CCE ": element type not modelled");                                                \
    ascend_sim::lanewise(dst, mask, mode, [&](int i) { return EXPR; });                                      \
  }                                                                                                          \
  template <class T, class S>                                                                                \
  inline void CAPI(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, S s, vector_bool mask) {                 \
    CCE(dst, a, (T)s, mask, MODE_ZEROING);                                                                   \
  }
#define VMI_ASCEND_SIM_UNARY(CCE, CAPI, CHECK, EXPR)                                                         \
  template <class T, class Mode>                                                                             \
  inline void CCE(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, vector_bool mask, Mode mode) {            \
    static_assert(CHECK, #CCE ": element type not modelled");                                                \
    ascend_sim::lanewise(dst, mask, mode, [&](int i) { return EXPR; });                                      \
  }                                                                                                          \
  template <class T>                                                                                         \
  inline void CAPI(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, vector_bool mask) {                      \
    CCE(dst, a, mask, MODE_ZEROING);                                                                         \
  }

// Float lanes are IEEE binary32 with round to nearest even and subnormals kept (ASSUMPTION:
// only the SFU pages, div/sqrt/exp/ln, mention flushing); NaN results are F32_NAN.
// [R arithmetic_compute/asc_add, asc_sub, asc_mul, asc_max, asc_min]
VMI_ASCEND_SIM_BINARY(vadd, asc_add, ascend_sim::is_alu_lane<T>, ascend_sim::add(a.lane[i], b.lane[i]))
VMI_ASCEND_SIM_BINARY(vsub, asc_sub, ascend_sim::is_alu_lane<T>, ascend_sim::sub(a.lane[i], b.lane[i]))
VMI_ASCEND_SIM_BINARY(vmul, asc_mul, ascend_sim::is_alu_lane<T>, ascend_sim::mul(a.lane[i], b.lane[i]))
VMI_ASCEND_SIM_BINARY(vmax, asc_max, ascend_sim::is_alu_lane<T>, ascend_sim::max(a.lane[i], b.lane[i]))
VMI_ASCEND_SIM_BINARY(vmin, asc_min, ascend_sim::is_alu_lane<T>, ascend_sim::min(a.lane[i], b.lane[i]))
// The division instruction [R arithmetic_compute/asc_div; RC 基础算术/Div]: float only
// here, operands and result flushed to zero (documented for the single-instruction
// algorithm), the quotient correctly rounded (ASSUMPTION: the page bounds it by 1 ulp).
// TileLang's default vdiv is its vdiv_0ulp_ftz_true wrapper around this instruction,
// which then runs as shipped: it keeps the quotient unless a neighbour's residual
// |a - z*b| (fused) is smaller or equal, which happens only when residuals underflow.
VMI_ASCEND_SIM_BINARY(vdiv, asc_div, (std::is_same_v<T, float>),
                      ascend_sim::canonical(ascend_sim::flush(ascend_sim::flush(a.lane[i]) /
                                                              ascend_sim::flush(b.lane[i]))))
// The square-root instruction [R arithmetic_compute/asc_sqrt; RC 基础算术/Sqrt]: float only here,
// operand flushed to zero, the root correctly rounded (ASSUMPTION: the page states no bound);
// a negative operand gives NaN. TileLang's default vsqrt is this instruction.
VMI_ASCEND_SIM_UNARY(vsqrt, asc_sqrt, (std::is_same_v<T, float>),
                     ascend_sim::canonical(std::sqrt(ascend_sim::flush(a.lane[i]))))
// [R logic_compute/asc_and, asc_or, asc_xor, asc_shiftleft, asc_shiftright]
VMI_ASCEND_SIM_BINARY(vand, asc_and, ascend_sim::is_int_lane<T>, (T)(a.lane[i] & b.lane[i]))
VMI_ASCEND_SIM_BINARY(vor, asc_or, ascend_sim::is_int_lane<T>, (T)(a.lane[i] | b.lane[i]))
VMI_ASCEND_SIM_BINARY(vxor, asc_xor, ascend_sim::is_int_lane<T>, (T)(a.lane[i] ^ b.lane[i]))
// The amount register is signed, of the value's width (a uint32 register of amounts does not compile).
#define VMI_ASCEND_SIM_SHIFT(CCE, CAPI, SHIFT)                                                               \
  template <class T, class Mode>                                                                             \
  inline void CCE(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, ascend_sim::vreg<std::make_signed_t<T>> b, \
                  vector_bool mask, Mode mode) {                                                             \
    static_assert(ascend_sim::is_int_lane<T>, #CCE ": element type not modelled");                           \
    ascend_sim::lanewise(dst, mask, mode, [&](int i) { return ascend_sim::SHIFT(a.lane[i], (int64_t)b.lane[i]); }); \
  }                                                                                                          \
  template <class T>                                                                                         \
  inline void CAPI(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, ascend_sim::vreg<std::make_signed_t<T>> b, \
                   vector_bool mask) {                                                                       \
    CCE(dst, a, b, mask, MODE_ZEROING);                                                                      \
  }
VMI_ASCEND_SIM_SHIFT(vshl, asc_shiftleft, shift_left)
VMI_ASCEND_SIM_SHIFT(vshr, asc_shiftright, shift_right)
#undef VMI_ASCEND_SIM_SHIFT
// [R arithmetic_compute/asc_add_scalar, asc_mul_scalar, asc_max_scalar, asc_min_scalar,
// logic_compute/asc_shiftleft_scalar, asc_shiftright_scalar]
VMI_ASCEND_SIM_SCALAR(vadds, asc_add_scalar, ascend_sim::is_alu_lane<T>, ascend_sim::add(a.lane[i], s))
VMI_ASCEND_SIM_SCALAR(vmuls, asc_mul_scalar, ascend_sim::is_alu_lane<T>, ascend_sim::mul(a.lane[i], s))
VMI_ASCEND_SIM_SCALAR(vmaxs, asc_max_scalar, ascend_sim::is_alu_lane<T>, ascend_sim::max(a.lane[i], s))
VMI_ASCEND_SIM_SCALAR(vmins, asc_min_scalar, ascend_sim::is_alu_lane<T>, ascend_sim::min(a.lane[i], s))
VMI_ASCEND_SIM_SCALAR(vshls, asc_shiftleft_scalar, ascend_sim::is_int_lane<T>,
                      ascend_sim::shift_left(a.lane[i], (int64_t)s))
VMI_ASCEND_SIM_SCALAR(vshrs, asc_shiftright_scalar, ascend_sim::is_int_lane<T>,
                      ascend_sim::shift_right(a.lane[i], (int64_t)s))
// [R arithmetic_compute/asc_abs, asc_neg, logic_compute/asc_not]
VMI_ASCEND_SIM_UNARY(vabs, asc_abs, ascend_sim::is_signed_lane<T>, ascend_sim::abs(a.lane[i]))
VMI_ASCEND_SIM_UNARY(vneg, asc_neg, ascend_sim::is_signed_lane<T>, ascend_sim::neg(a.lane[i]))
VMI_ASCEND_SIM_UNARY(vnot, asc_not, ascend_sim::is_int_lane<T>, (T)~a.lane[i])
#undef VMI_ASCEND_SIM_BINARY
#undef VMI_ASCEND_SIM_SCALAR
#undef VMI_ASCEND_SIM_UNARY

// Fused multiply-adds, one rounding [RC 复合计算/MulAddDst, MulDstAdd, Axpy]:
// vmula dst = a*b + dst, vmadd dst = dst*a + b, axpy dst = s*src + dst.
template <class Mode>
inline void vmula(vector_f32 &dst, vector_f32 a, vector_f32 b, vector_bool mask, Mode mode) {
  const vector_f32 acc = dst;
  ascend_sim::lanewise(dst, mask, mode,
                       [&](int i) { return ascend_sim::canonical(std::fma(a.lane[i], b.lane[i], acc.lane[i])); });
}
template <class Mode>
inline void vmadd(vector_f32 &dst, vector_f32 a, vector_f32 b, vector_bool mask, Mode mode) {
  const vector_f32 acc = dst;
  ascend_sim::lanewise(dst, mask, mode,
                       [&](int i) { return ascend_sim::canonical(std::fma(acc.lane[i], a.lane[i], b.lane[i])); });
}
inline void asc_madd(vector_f32 &dst, vector_f32 a, vector_f32 b, vector_bool mask) {
  vmadd(dst, a, b, mask, MODE_ZEROING);
}
template <class Mode>
inline void vaxpy(vector_f32 &dst, vector_f32 src, float s, vector_bool mask, Mode mode) {
  const vector_f32 acc = dst;
  ascend_sim::lanewise(dst, mask, mode,
                       [&](int i) { return ascend_sim::canonical(std::fma(s, src.lane[i], acc.lane[i])); });
}
inline void asc_axpy(vector_f32 &dst, vector_f32 src, float s, vector_bool mask) {
  vaxpy(dst, src, s, mask, MODE_ZEROING);
}

// asc_select [R compare_and_select/asc_select]: src0's lane where the mask is set, else src1's.
template <class T>
inline void asc_select(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> a, ascend_sim::vreg<T> b, vector_bool mask) {
  ascend_sim::count_instruction();
  for (int i = 0; i < ascend_sim::vreg<T>::lanes; ++i)
    dst.lane[i] = ascend_sim::active<T>(mask, i) ? a.lane[i] : b.lane[i];
}

// Compares [R compare_and_select/asc_eq ... asc_le, and their _scalar forms]: one
// predicate bit per active lane, at the lane's lowest byte; inactive lanes give 0. IEEE
// comparisons for float (a NaN compares unequal to everything).
#define VMI_ASCEND_SIM_COMPARE(NAME, OP)                                                                     \
  template <class T>                                                                                         \
  inline void asc_##NAME(vector_bool &dst, ascend_sim::vreg<T> a, ascend_sim::vreg<T> b, vector_bool mask) {  \
    static_assert(ascend_sim::is_alu_lane<T>, "asc_" #NAME ": element type not modelled");                  \
    ascend_sim::count_instruction();                                                                         \
    vector_bool out{};                                                                                       \
    for (int i = 0; i < ascend_sim::vreg<T>::lanes; ++i)                                                     \
      out.bit[i * sizeof(T)] = ascend_sim::active<T>(mask, i) && a.lane[i] OP b.lane[i];                     \
    dst = out;                                                                                               \
  }                                                                                                          \
  template <class T, class S>                                                                                \
  inline void asc_##NAME##_scalar(vector_bool &dst, ascend_sim::vreg<T> a, S s, vector_bool mask) {          \
    static_assert(ascend_sim::is_alu_lane<T>, "asc_" #NAME "_scalar: element type not modelled");           \
    ascend_sim::count_instruction();                                                                         \
    vector_bool out{};                                                                                       \
    for (int i = 0; i < ascend_sim::vreg<T>::lanes; ++i)                                                     \
      out.bit[i * sizeof(T)] = ascend_sim::active<T>(mask, i) && a.lane[i] OP(T) s;                          \
    dst = out;                                                                                               \
  }
VMI_ASCEND_SIM_COMPARE(eq, ==)
VMI_ASCEND_SIM_COMPARE(ne, !=)
VMI_ASCEND_SIM_COMPARE(gt, >)
VMI_ASCEND_SIM_COMPARE(ge, >=)
VMI_ASCEND_SIM_COMPARE(lt, <)
VMI_ASCEND_SIM_COMPARE(le, <=)
#undef VMI_ASCEND_SIM_COMPARE

// ---- fills and index ramps -----------------------------------------------------------
// [R data_fill/asc_duplicate_scalar]
template <class T, class S>
inline void asc_duplicate_scalar(ascend_sim::vreg<T> &dst, S value, vector_bool mask) {
  static_assert(ascend_sim::is_alu_lane<T>, "asc_duplicate_scalar: element type not modelled");
  ascend_sim::lanewise(dst, mask, MODE_ZEROING, [&](int) { return (T)value; });
}
template <class T, class S, class Mode>
inline void vdup(ascend_sim::vreg<T> &dst, S value, vector_bool mask, Mode mode) {  // the merging form [TL]
  static_assert(ascend_sim::is_alu_lane<T>, "vdup: element type not modelled");
  ascend_sim::lanewise(dst, mask, mode, [&](int) { return (T)value; });
}
// asc_duplicate [R data_fill/asc_duplicate]: the lowest lane in every active lane
// (TileLang's vdupv with POS_LOWEST). The highest-lane form simd_inst.h reaches for
// POS_HIGHEST is in no C API header or page (Duplicate's `pos` takes only LOWEST).
template <class T>
inline void asc_duplicate(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  static_assert(ascend_sim::is_data_lane<T>, "asc_duplicate: element type not modelled");
  ascend_sim::lanewise(dst, mask, MODE_ZEROING, [&](int) { return src.lane[0]; });
}
template <class T>
VMI_UNMODELLED("asc_duplicate_highest")
void asc_duplicate_highest(ascend_sim::vreg<T> &, ascend_sim::vreg<T>, vector_bool);
// asc_arange [R index_operate/asc_arange]: value, value + 1, ... (descending: reversed).
template <class T, class S>
inline void asc_arange(ascend_sim::vreg<T> &dst, S value) {
  static_assert(ascend_sim::is_alu_lane<T>, "asc_arange: element type not modelled");
  ascend_sim::count_instruction();
  for (int i = 0; i < ascend_sim::vreg<T>::lanes; ++i) dst.lane[i] = ascend_sim::add((T)value, (T)i);
}
template <class T, class S>
inline void asc_arange_descend(ascend_sim::vreg<T> &dst, S value) {
  static_assert(ascend_sim::is_alu_lane<T>, "asc_arange_descend: element type not modelled");
  ascend_sim::count_instruction();
  constexpr int N = ascend_sim::vreg<T>::lanes;
  for (int i = 0; i < N; ++i) dst.lane[i] = ascend_sim::add((T)value, (T)(N - 1 - i));
}

// ---- rearrangements ----------------------------------------------------------------
// asc_intlv / asc_deintlv [R data_rearrange/asc_intlv, asc_deintlv; RC 数据重排/Interleave,
// DeInterleave]: the pages draw the layout only in figures. AscendC's Interleave and
// DeInterleave of UB tensors (impl/basic_api/dav_3510/kernel_operator_vec_duplicate_impl.h,
// InterleaveImplNormal, DeInterleaveImplNormal) fix it: with N lanes, asc_intlv puts the 2N
// elements src0[0], src1[0], src0[1], src1[1], ... into dst0 (the first N) and dst1 (the
// last N); asc_deintlv takes the 2N elements src0, src1 in order and puts the even ones
// into dst0, the odd ones into dst1. Sources may be the destinations (documented).
template <class T>
inline void asc_intlv(ascend_sim::vreg<T> &dst0, ascend_sim::vreg<T> &dst1, ascend_sim::vreg<T> src0,
                      ascend_sim::vreg<T> src1) {
  using namespace ascend_sim;
  static_assert(is_data_lane<T>, "asc_intlv: element type not modelled");
  count_instruction();
  constexpr int N = vreg<T>::lanes;
  for (int j = 0; j < 2 * N; ++j) (j < N ? dst0.lane[j] : dst1.lane[j - N]) = (j % 2 ? src1 : src0).lane[j / 2];
}
template <class T>
inline void asc_deintlv(ascend_sim::vreg<T> &dst0, ascend_sim::vreg<T> &dst1, ascend_sim::vreg<T> src0,
                        ascend_sim::vreg<T> src1) {
  using namespace ascend_sim;
  static_assert(is_data_lane<T>, "asc_deintlv: element type not modelled");
  count_instruction();
  constexpr int N = vreg<T>::lanes;
  for (int k = 0; k < N; ++k) {
    dst0.lane[k] = (2 * k < N ? src0.lane[2 * k] : src1.lane[2 * k - N]);
    dst1.lane[k] = (2 * k + 1 < N ? src0.lane[2 * k + 1] : src1.lane[2 * k + 1 - N]);
  }
}

// asc_gather of a register [R reg_load/asc_gather, "收集矢量数据寄存器中的元素"; RC
// 离散操作/Gather] (TileLang's vselr): dst[i] = src[index[i] % N], N the lane count
// (documented: an index past the register wraps); index lanes have the data's width. The
// C API has no float form: TileLang's vselr reinterprets f32 lanes as u32.
template <class T, class I>
inline void asc_gather(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, ascend_sim::vreg<I> index) {
  using namespace ascend_sim;
  static_assert(is_data_lane<T> && !std::is_same_v<T, float> && std::is_same_v<I, index_of<T>>,
                "asc_gather (register): element or index type not modelled");
  count_instruction();
  constexpr int N = vreg<T>::lanes;
  vreg<T> out;
  for (int i = 0; i < N; ++i) out.lane[i] = src.lane[index.lane[i] % N];
  dst = out;
}

// ---- reductions ------------------------------------------------------------------
// [R reduce_compute/asc_reduce_max, asc_reduce_min; RC 归约计算/Reduce]: lane 0 holds
// the extreme of the active lanes, lane 1 the index of its first occurrence (as the
// lane's bit pattern), every other lane 0; max(-0, +0) = +0, min(-0, +0) = -0; a NaN
// gives NaN (F32_NAN, ASSUMPTION on the bits) and the first NaN's index; no active lane
// gives -inf (+inf) or the integer minimum (maximum), index 0.
namespace ascend_sim {

// x comes after y in the order of max/min: -0 before +0.
template <class T>
inline bool after(T x, T y) {
  if constexpr (std::is_same_v<T, float>)
    if (x == y) return !std::signbit(x) && std::signbit(y);
  return x > y;
}

template <class T, bool Max>
inline void reduce_extreme(vreg<T> &dst, const vreg<T> &src, const vector_bool &mask) {
  static_assert(is_alu_lane<T>, "vcmax/vcmin: element type not modelled");
  using Lim = std::numeric_limits<T>;
  T best = Max ? (Lim::has_infinity ? -Lim::infinity() : Lim::lowest())
                : (Lim::has_infinity ? Lim::infinity() : Lim::max());
  int at = -1;
  for (int i = 0; i < vreg<T>::lanes; ++i) {
    if (!active<T>(mask, i)) continue;
    const T x = src.lane[i];
    if constexpr (std::is_same_v<T, float>) {
      if (std::isnan(x)) {
        best = float_of(F32_NAN);
        at = i;
        break;
      }
    }
    if (at < 0 || (Max ? after(x, best) : after(best, x))) {
      best = x;
      at = i;
    }
  }
  using Index = std::conditional_t<sizeof(T) == 4, uint32_t, std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>>;
  const Index index = (Index)(at < 0 ? 0 : at);
  vreg<T> out{};
  out.lane[0] = best;
  memcpy(&out.lane[1], &index, sizeof(T));
  dst = out;
}

// Sums add in a binary tree [R reduce_compute/asc_reduce_sum]: lanes (0,1), (2,3), ...,
// then their sums pairwise. An inactive lane takes no part: a node with one present
// operand passes it unchanged (the pair rule of asc_pair_reduce_sum), and a sum of no
// active lane is +0 (documented).
template <class A, class T>
inline A tree_sum(const vreg<T> &src, const vector_bool &mask, int first, int count) {
  A part[256];
  bool present[256];
  for (int i = 0; i < count; ++i) {
    part[i] = (A)src.lane[first + i];
    present[i] = active<T>(mask, first + i);
  }
  for (int n = count; n > 1; n /= 2)
    for (int i = 0; i < n / 2; ++i) {
      const A a = part[2 * i], b = part[2 * i + 1];
      const bool pa = present[2 * i], pb = present[2 * i + 1];
      part[i] = pa && pb ? add(a, b) : pa ? a : b;
      present[i] = pa || pb;
    }
  return present[0] ? part[0] : A{};
}

}  // namespace ascend_sim

template <class T, class Mode>
inline void vcmax(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask, Mode) {
  static_assert(Mode::value == VMI_ZEROING, "vcmax: only MODE_ZEROING is modelled");
  ascend_sim::count_instruction();
  ascend_sim::reduce_extreme<T, true>(dst, src, mask);
}
template <class T, class Mode>
inline void vcmin(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask, Mode) {
  static_assert(Mode::value == VMI_ZEROING, "vcmin: only MODE_ZEROING is modelled");
  ascend_sim::count_instruction();
  ascend_sim::reduce_extreme<T, false>(dst, src, mask);
}
template <class T>
inline void asc_reduce_max(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  vcmax(dst, src, mask, MODE_ZEROING);
}
template <class T>
inline void asc_reduce_min(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  vcmin(dst, src, mask, MODE_ZEROING);
}

// asc_reduce_sum: the sum in lane 0, other lanes 0; 16-bit integers sum in 32 bits.
template <class D, class T>
inline void asc_reduce_sum(ascend_sim::vreg<D> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  static_assert(std::is_same_v<D, T> ? ascend_sim::is_alu_lane<T> && sizeof(T) == 4
                                     : ascend_sim::is_int_lane<T> && sizeof(T) == 2 && sizeof(D) == 4 &&
                                           std::is_signed_v<T> == std::is_signed_v<D>,
                "asc_reduce_sum: element types not modelled");
  ascend_sim::count_instruction();
  ascend_sim::vreg<D> out{};
  out.lane[0] = ascend_sim::tree_sum<D>(src, mask, 0, ascend_sim::vreg<T>::lanes);
  dst = out;
}

// asc_pair_reduce_sum [R reduce_compute/asc_pair_reduce_sum]: lane i of the low half is
// src[2i] + src[2i+1] over the active ones (0 if neither is), the high half 0.
template <class T>
inline void asc_pair_reduce_sum(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  static_assert(std::is_same_v<T, float>, "asc_pair_reduce_sum: element type not modelled");
  ascend_sim::count_instruction();
  ascend_sim::vreg<T> out{};
  for (int i = 0; i < ascend_sim::vreg<T>::lanes / 2; ++i)
    out.lane[i] = ascend_sim::tree_sum<T>(src, mask, 2 * i, 2);
  dst = out;
}

// Per 32-byte block [R reduce_compute/asc_reduce_{max,min,sum}_datablock; RC
// 归约计算/ReduceDataBlock]: block k's result in lane k, other lanes 0; no index; the
// same special values as the whole-register forms, NaN giving NaN.
namespace ascend_sim {

template <class T, int Kind>  // 0 sum, 1 max, 2 min
inline void reduce_blocks(vreg<T> &dst, const vreg<T> &src, const vector_bool &mask) {
  static_assert(is_alu_lane<T> && sizeof(T) >= 2, "datablock reductions: element type not modelled");
  count_instruction();
  constexpr int per_block = 32 / sizeof(T);
  vreg<T> out{};
  for (int k = 0; k < VL / 32; ++k) {
    if constexpr (Kind == 0) {
      out.lane[k] = tree_sum<T>(src, mask, k * per_block, per_block);
    } else {
      vector_bool block{};
      memcpy(block.bit + k * 32, mask.bit + k * 32, 32);
      vreg<T> extreme;
      reduce_extreme<T, Kind == 1>(extreme, src, block);
      out.lane[k] = extreme.lane[0];
    }
  }
  dst = out;
}

}  // namespace ascend_sim

template <class T>
inline void asc_reduce_sum_datablock(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  ascend_sim::reduce_blocks<T, 0>(dst, src, mask);
}
template <class T>
inline void asc_reduce_max_datablock(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  ascend_sim::reduce_blocks<T, 1>(dst, src, mask);
}
template <class T>
inline void asc_reduce_min_datablock(ascend_sim::vreg<T> &dst, ascend_sim::vreg<T> src, vector_bool mask) {
  ascend_sim::reduce_blocks<T, 2>(dst, src, mask);
}
