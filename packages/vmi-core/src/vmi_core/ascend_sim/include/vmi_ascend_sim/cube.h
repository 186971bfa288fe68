// vmi ascend-sim: the Cube unit of an AI core (AIC) and the cross-core intrinsics of a
// mixed kernel: the C API subset TileLang 0.1.15 emits for `T.gemm` on `ascend`, and that
// its <tl_templates/ascend/gemm.h> (`ascend_gemm_l1`, compiled as shipped) calls.
//
// Sources:
//  [K]     asc-devkit impl/basic_api/utils/kernel_utils_constants.h, __NPU_ARCH__ == 3510
//          (Ascend 950): L1 512 KiB, L0C 256 KiB; L0A and L0B 64 KiB each;
//  [D3510] asc-devkit docs/zh/api/SIMD-API/C-API: asc_copy_gm2l1_nd2nz (arch 3510),
//          asc_set_gm2l1_nz_para (the MTE2_NZ_PARA register), asc_fill_l1, asc_mmad,
//          asc_lock / asc_unlock, asc_sync_intra_arrive / asc_sync_intra_wait,
//          asc_get_sub_block_id;
//  [TL]    tilelang 0.1.15 src/ascend/codegen/codegen_ascend.cc (EmitGmToL1Copy_,
//          EmitL0cTo{Gm,Ubuf}Copy_, EmitFillL1_: which IR argument goes where) and
//          tl_templates/ascend/gemm.h (`ascend_gemm_l1`: L1 -> L0A/L0B, Mmad, mutexes).
//
// Memories of the AIC: L1 (`__cbuf__`), L0A (`__ca__`), L0B (`__cb__`), L0C (`__cc__`),
// each a byte array of its documented capacity, filled with random bytes when the AI core
// starts (a read of what nothing wrote shows up as wrong data); every access is checked
// against the capacity (an overflow is an error naming the memory).
//
// Layouts (the element at row r, column c; C0 = 32 bytes / element size, a fractal is 16
// rows of 32 bytes, 512 bytes):
//  * L1 holds a GM ND matrix as NZ: column block c / C0 at c0_stride * 32 bytes, row r at
//    n_stride * 32 bytes within it, element c % C0 within the row's 32 bytes
//    (asc_set_gm2l1_nz_para; [D3510] "ND->NZ"); a partial last column block is padded
//    with zeros [D3510];
//  * L0A / L0B: the fractals a copy brings, fractal (row block i, column block j) at
//    (j * dst_stride + i) * 512 bytes (ASSUMPTION: the template's dst_stride is the
//    distance between column blocks, as its value, the row blocks per column, says); a
//    fractal keeps its 16 rows of 32 bytes;
//  * L0C (fp32): 16 x 16 fractals, element (m, n) at ((n / 16) * M16 + m) * 16 + n % 16
//    floats, M16 the Mmad's rows rounded up to 16 (ASSUMPTION, consistent with the
//    src_stride of the emitted L0C copies); the L0C copies turn it back into ND (nz2nd).
//
// Mmad (asc_mmad, PIPE_M): C[m, n] (+)= sum over k of A[m, k] * B[n, k], A the left matrix
// in L0A (m x k), B the right matrix in L0B stored as n x k (the layout `ascend_gemm_l1`
// builds with TRANS_B; [TL]). ASSUMPTION (order): per output element, from C (or +0.0 when
// the accumulator is initialised) the products are added in increasing k, each addition
// rounded to fp32 (round to nearest even). bf16 x bf16 products are exact in fp32, so this
// order is the only rounding; the hardware's adder tree is not documented and may add in
// another order, which is why results of the Cube are compared within a bound.
#pragma once

#include "mix.h"
#include "simd.h"

#define __cube__
#define __mix__(cube_cores, vector_cores)
#define ASC_IS_AIC (::ascend_sim::X.unit == ::ascend_sim::UNIT_AIC)
#define ASC_IS_AIV (::ascend_sim::X.unit != ::ascend_sim::UNIT_AIC)

enum asc_unit_flag_mode { ASC_UNIT_FLAG_DISABLE = 0 };
enum asc_quant_mode { ASC_QUANT_NONE = 0 };
enum asc_relu_pre_mode { ASC_RELU_NONE = 0 };
enum asc_dual_dst_mode { ASC_DUAL_DST_DISABLE = 0 };
enum ascMutexExecuteMode { ASC_LOCK_BLOCK = 0, ASC_LOCK_NON_BLOCK = 1 };

// asc_fill_l1's parameters, as TileLang emits them [TL]: `repeat` times, `blk_num` 32-byte
// blocks written then `dst_gap` blocks skipped.
struct asc_fill_value_config {
  uint64_t repeat, blk_num, dst_gap;
};

namespace ascend_sim {

enum Memory { MEM_L1 = 0, MEM_L0A, MEM_L0B, MEM_L0C, NUM_CUBE_MEMORIES };

constexpr int64_t CUBE_MEMORY_BYTES[NUM_CUBE_MEMORIES] = {512 * 1024, 64 * 1024, 64 * 1024, 256 * 1024};  // [K]
constexpr int64_t FRACTAL_ROWS = 16;
constexpr int64_t FRACTAL_BYTES = FRACTAL_ROWS * 32;

inline const char *memory_name(int m) {
  static const char *names[NUM_CUBE_MEMORIES] = {"L1", "L0A", "L0B", "L0C"};
  return names[m];
}

struct Cube {
  std::vector<uint64_t> memory[NUM_CUBE_MEMORIES];
  // MTE2_NZ_PARA [D3510]: ND matrices per copy, N stride, C0-column stride, matrix stride
  // (strides in 32-byte blocks).
  uint64_t nd_num = 1, n_stride = 1, c0_stride = 0, matrix_stride = 0;

  // At the start of an AI core: random contents, default registers.
  void reset() {
    for (int m = 0; m < NUM_CUBE_MEMORIES; ++m) {
      memory[m].resize(CUBE_MEMORY_BYTES[m] / 8);
      for (auto &word : memory[m]) word = random_u64();
    }
    nd_num = n_stride = 1;
    c0_stride = matrix_stride = 0;
  }
};

inline Cube C;

// The bytes [offset, offset + bytes) of a Cube memory, checked against its capacity.
inline uint8_t *cube_bytes(int memory, int64_t offset, int64_t bytes, const char *what) {
  if (X.unit != UNIT_AIC) fail("%s: %s is the Cube core's memory; an AIV has no access to it", what, memory_name(memory));
  if (offset < 0 || offset + bytes > CUBE_MEMORY_BYTES[memory])
    fail("%s: %s bytes [%lld, %lld) outside its %lld bytes", what, memory_name(memory), (long long)offset,
         (long long)(offset + bytes), (long long)CUBE_MEMORY_BYTES[memory]);
  return reinterpret_cast<uint8_t *>(C.memory[memory].data()) + offset;
}

// An address in a Cube memory: a byte offset, as `__cbuf__ T*` and friends are on the device.
template <class T, int Mem>
struct local_ptr {
  int64_t offset = 0;

  local_ptr() = default;
  explicit local_ptr(int byte_offset) : offset(byte_offset) {}  // `(__cbuf__ uint8_t *)0`: the base
  template <class U>
  explicit local_ptr(local_ptr<U, Mem> other) : offset(other.offset) {}

  local_ptr operator+(int64_t i) const {
    local_ptr p;
    p.offset = offset + i * (int64_t)sizeof(T);
    return p;
  }
};

template <class T>
using cbuf_ptr = local_ptr<T, MEM_L1>;
template <class T>
using ca_ptr = local_ptr<T, MEM_L0A>;
template <class T>
using cb_ptr = local_ptr<T, MEM_L0B>;
template <class T>
using cc_ptr = local_ptr<T, MEM_L0C>;

// The value the Cube multiplies for an operand element.
template <class T>
inline float cube_operand(T x) {
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    uint32_t bits = (uint32_t)x.bits << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
  } else {
    static_assert(sizeof(T) == 0, "Mmad of this operand type is not modelled");
  }
}

inline void require(bool ok, const char *what, const char *rule) {
  if (!ok) fail("%s: %s is not modelled", what, rule);
}

// L1 -> L0A / L0B on MTE1 [TL gemm.h]: m_step x k_step fractals from row block m_start and
// column block k_start of an NZ matrix whose column blocks are src_stride fractals apart.
template <class T, int Dst>
inline void copy_l1_to_l0(local_ptr<T, Dst> dst, cbuf_ptr<T> src, uint16_t m_start, uint16_t k_start, uint16_t m_step,
                          uint16_t k_step, uint16_t src_stride, uint16_t dst_stride, const char *name) {
  char what[200];
  snprintf(what, sizeof what, "%s(%s+%lld, L1+%lld, m_start=%u, k_start=%u, m_step=%u, k_step=%u)", name,
           memory_name(Dst), (long long)dst.offset, (long long)src.offset, m_start, k_start, m_step, k_step);
  if (dst.offset % 512 || src.offset % 32) fail("%s: L0 address not 512-byte or L1 address not 32-byte aligned", what);
  const int64_t s0 = src.offset, d0 = dst.offset;
  for (int j = 0; j < k_step; ++j)
    for (int i = 0; i < m_step; ++i) {
      cube_bytes(MEM_L1, s0 + ((int64_t)(k_start + j) * src_stride + m_start + i) * FRACTAL_BYTES, FRACTAL_BYTES, what);
      cube_bytes(Dst, d0 + ((int64_t)j * dst_stride + i) * FRACTAL_BYTES, FRACTAL_BYTES, what);
    }
  issue(PIPE_MTE1, Op{Op::WORK, 0, 0, 0, [=] {
                        for (int j = 0; j < k_step; ++j)
                          for (int i = 0; i < m_step; ++i)
                            memcpy(cube_bytes(Dst, d0 + ((int64_t)j * dst_stride + i) * FRACTAL_BYTES, FRACTAL_BYTES, ""),
                                   cube_bytes(MEM_L1, s0 + ((int64_t)(k_start + j) * src_stride + m_start + i) *
                                                          FRACTAL_BYTES, FRACTAL_BYTES, ""),
                                   FRACTAL_BYTES);
                      },
                      what});
}

// The L0C -> ND moves of the FIX pipe [TL]: element (m, n) of the fp32 accumulator, read at
// its NZ place (column blocks src_stride rows apart), to `store(m, n, value)`.
template <class Check, class Store>
inline void copy_l0c_to_nd(cc_ptr<float> src, uint16_t n_size, uint16_t m_size, uint16_t src_stride, bool nz2nd,
                           int quant, int relu, int unit_flag, bool split, bool nz2dn, int clip_relu, const char *what,
                           Check check, Store store) {
  require(nz2nd && !nz2dn && !split, what, "an L0C copy other than NZ -> ND");
  require(quant == 0 && relu == 0 && clip_relu == 0, what, "quantisation or ReLU on the L0C copy");
  require(unit_flag == 0, what, "a unit flag");
  const int64_t s0 = src.offset;
  auto at = [=](int m, int n) { return s0 + (((int64_t)(n / 16) * src_stride + m) * 16 + n % 16) * 4; };
  for (int n = 0; n < n_size; n += 16)
    for (int m = 0; m < m_size; ++m) cube_bytes(MEM_L0C, at(m, n), 4 * std::min(16, n_size - n), what);
  check();
  issue(PIPE_FIX, Op{Op::WORK, 0, 0, 0, [=] {
                       for (int m = 0; m < m_size; ++m)
                         for (int n = 0; n < n_size; ++n) {
                           float value;
                           memcpy(&value, cube_bytes(MEM_L0C, at(m, n), 4, ""), 4);
                           store(m, n, value);
                         }
                     },
                     what});
}

// The cross-core target of an arrive by the running instance (ASSUMPTION, from the pairs
// TileLang emits: an AIV's arrive on id reaches the AIC's counter id + 16 * sub-block, the
// AIC's arrive on id + 16 * s reaches AIV s's counter id).
inline int intra_target(int16_t id, int *target_id) {
  if (X.unit == UNIT_AIC) {
    *target_id = id % 16;
    return id < 16 ? UNIT_AIV0 : UNIT_AIV1;
  }
  *target_id = id + 16 * (X.unit - UNIT_AIV0);
  return UNIT_AIC;
}

}  // namespace ascend_sim

inline int32_t asc_get_sub_block_id() {
  using namespace ascend_sim;
  if (X.unit == UNIT_AIC) fail("asc_get_sub_block_id on the Cube core");
  return X.unit - UNIT_AIV0;
}

// set_flag / wait_flag between the cores of an AI core [D3510]: each arrive raises a counter
// of the other core by one, when the issuing pipe reaches it; a wait blocks its pipe while
// its counter is 0, then takes one.
inline void asc_sync_intra_arrive(pipe_t pipe, int16_t sync_id) {
  using namespace ascend_sim;
  if (sync_id < 0 || sync_id >= NUM_INTRA_IDS || (X.unit != UNIT_AIC && sync_id >= 16))
    fail("asc_sync_intra_arrive: sync id %d out of range", (int)sync_id);
  int target_id;
  const int target = intra_target(sync_id, &target_id);
  char what[96];
  snprintf(what, sizeof what, "asc_sync_intra_arrive(%s, %d)", pipe_name(pipe), (int)sync_id);
  issue(pipe, Op{Op::ARRIVE, (int)pipe, target, target_id, {}, what});
}

inline void asc_sync_intra_wait(pipe_t pipe, int16_t sync_id) {
  using namespace ascend_sim;
  if (sync_id < 0 || sync_id >= NUM_INTRA_IDS) fail("asc_sync_intra_wait: sync id %d out of range", (int)sync_id);
  char what[96];
  snprintf(what, sizeof what, "asc_sync_intra_wait(%s, %d)", pipe_name(pipe), (int)sync_id);
  issue(pipe, Op{Op::AWAIT, (int)pipe, X.unit, (int)sync_id, {}, what});
}

// Mutexes between the pipes of one core [D3510]: asc_lock blocks its pipe until every
// asc_unlock of the same id issued before it has run; asc_unlock releases on its pipe.
inline void asc_lock(pipe_t pipe, int mutex_id, ascMutexExecuteMode mode = ASC_LOCK_BLOCK) {
  using namespace ascend_sim;
  if (mutex_id < 0 || mutex_id >= NUM_MUTEXES) fail("asc_lock: mutex id %d outside [0, 32)", mutex_id);
  if (mode != ASC_LOCK_BLOCK) fail("asc_lock: the non-blocking mode is not modelled");
  char what[64];
  snprintf(what, sizeof what, "asc_lock(%s, %d)", pipe_name(pipe), mutex_id);
  issue(pipe, Op{Op::LOCK, (int)P.unlocks_issued[mutex_id], 0, mutex_id, {}, what});
}

inline void asc_unlock(pipe_t pipe, int mutex_id, ascMutexExecuteMode mode = ASC_LOCK_BLOCK) {
  using namespace ascend_sim;
  if (mutex_id < 0 || mutex_id >= NUM_MUTEXES) fail("asc_unlock: mutex id %d outside [0, 32)", mutex_id);
  if (mode != ASC_LOCK_BLOCK) fail("asc_unlock: the non-blocking mode is not modelled");
  ++P.unlocks_issued[mutex_id];
  char what[64];
  snprintf(what, sizeof what, "asc_unlock(%s, %d)", pipe_name(pipe), mutex_id);
  issue(pipe, Op{Op::UNLOCK, 0, 0, mutex_id, {}, what});
}

// The MTE2_NZ_PARA register [D3510] (TileLang passes its four fields): read by the next
// ND -> NZ copies when they are issued (ASSUMPTION: a register write of the scalar unit,
// in order with the copies that follow it).
inline void asc_set_gm2l1_nz_para(uint16_t nd_num, uint16_t n_stride, uint16_t c0_stride, uint16_t matrix_stride) {
  ascend_sim::C.nd_num = nd_num;
  ascend_sim::C.n_stride = n_stride;
  ascend_sim::C.c0_stride = c0_stride;
  ascend_sim::C.matrix_stride = matrix_stride;
}

// GM (ND) -> L1 (NZ) on MTE2 [D3510][TL]: n_value rows of d_value elements, row r at
// src + r * loop1_src_stride bytes, to the NZ place of the register's strides; the columns
// of a partial last C0 block are zeros. Rows beyond n_value are not written.
template <class T>
inline void asc_copy_gm2l1_nd2nz(ascend_sim::cbuf_ptr<T> dst, T *src, uint64_t loop1_src_stride,
                                 asc_load_l2_cache_mode, uint16_t n_value, uint32_t d_value, uint64_t loop4_src_stride,
                                 bool smallc0_en) {
  using namespace ascend_sim;
  constexpr int64_t E = sizeof(T), C0 = 32 / sizeof(T);
  char what[200];
  snprintf(what, sizeof what, "asc_copy_gm2l1_nd2nz(L1+%lld, n_value=%u, d_value=%u, src_stride=%llu)",
           (long long)dst.offset, n_value, d_value, (unsigned long long)loop1_src_stride);
  require(C.nd_num == 1 && loop4_src_stride == 0, what, "more than one ND matrix per copy");
  require(!smallc0_en, what, "the small-C0 mode");
  if (dst.offset % 32) fail("%s: L1 address not 32-byte aligned", what);
  if ((uintptr_t)src % E || loop1_src_stride % E) fail("%s: GM rows not aligned to their elements", what);
  const int64_t blocks = (d_value + C0 - 1) / C0, n_stride = (int64_t)C.n_stride * 32, c0_stride = (int64_t)C.c0_stride * 32;
  const int64_t d0 = dst.offset;
  const uint8_t *gm = reinterpret_cast<const uint8_t *>(src);
  for (int64_t r = 0; r < n_value; ++r) {
    check_gm((uintptr_t)(gm + r * loop1_src_stride), d_value * E, what);
    for (int64_t b = 0; b < blocks; ++b) cube_bytes(MEM_L1, d0 + b * c0_stride + r * n_stride, 32, what);
  }
  issue(PIPE_MTE2, Op{Op::WORK, 0, 0, 0, [=] {
                        for (int64_t r = 0; r < n_value; ++r)
                          for (int64_t b = 0; b < blocks; ++b) {
                            uint8_t *row = cube_bytes(MEM_L1, d0 + b * c0_stride + r * n_stride, 32, "");
                            const int64_t cols = std::min<int64_t>(C0, d_value - b * C0);
                            memcpy(row, gm + r * loop1_src_stride + b * C0 * E, cols * E);
                            memset(row + cols * E, 0, (C0 - cols) * E);
                          }
                      },
                      what});
}

// Fill L1 with a value [D3510][TL]: `repeat` times, `blk_num` 32-byte blocks of `value`
// (in elements of T), then `dst_gap` blocks skipped. On MTE2 (ASSUMPTION: TileLang orders the
// fills with pipe_barrier(PIPE_MTE2) and the MTE2 -> MTE1 flag of its loads).
template <class T>
inline void asc_fill_l1(ascend_sim::cbuf_ptr<T> dst, uint32_t value, asc_fill_value_config config) {
  using namespace ascend_sim;
  static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, uint32_t>, "fill words of 16 or 32 bits");
  char what[160];
  snprintf(what, sizeof what, "asc_fill_l1(L1+%lld, repeat=%llu, blk_num=%llu, dst_gap=%llu)", (long long)dst.offset,
           (unsigned long long)config.repeat, (unsigned long long)config.blk_num, (unsigned long long)config.dst_gap);
  if (dst.offset % 32) fail("%s: L1 address not 32-byte aligned", what);
  const int64_t d0 = dst.offset, step = (int64_t)(config.blk_num + config.dst_gap) * 32, span = config.blk_num * 32;
  for (uint64_t r = 0; r < config.repeat; ++r) cube_bytes(MEM_L1, d0 + (int64_t)r * step, span, what);
  const T word = (T)value;
  issue(PIPE_MTE2, Op{Op::WORK, 0, 0, 0, [=] {
                        for (uint64_t r = 0; r < config.repeat; ++r) {
                          uint8_t *at = cube_bytes(MEM_L1, d0 + (int64_t)r * step, span, "");
                          for (int64_t i = 0; i < span; i += sizeof(T)) memcpy(at + i, &word, sizeof(T));
                        }
                      },
                      what});
}

template <class T>
inline void asc_copy_l12l0a(ascend_sim::ca_ptr<T> dst, ascend_sim::cbuf_ptr<T> src, uint16_t m_start, uint16_t k_start,
                            uint16_t m_step, uint16_t k_step, uint16_t src_stride, uint16_t dst_stride) {
  ascend_sim::copy_l1_to_l0(dst, src, m_start, k_start, m_step, k_step, src_stride, dst_stride, "asc_copy_l12l0a");
}

template <class T>
inline void asc_copy_l12l0b(ascend_sim::cb_ptr<T> dst, ascend_sim::cbuf_ptr<T> src, uint16_t n_start, uint16_t k_start,
                            uint16_t n_step, uint16_t k_step, uint16_t src_stride, uint16_t dst_stride) {
  ascend_sim::copy_l1_to_l0(dst, src, n_start, k_start, n_step, k_step, src_stride, dst_stride, "asc_copy_l12l0b");
}

// Mmad on PIPE_M [D3510][TL]: c (m x n, fp32) = a (m x k) * b (n x k)^T, added to c unless
// c_matrix_init_val; the order of the additions is the header's ASSUMPTION.
template <class T>
inline void asc_mmad(ascend_sim::cc_ptr<float> c, ascend_sim::ca_ptr<T> a, ascend_sim::cb_ptr<T> b, uint16_t m,
                     uint16_t k, uint16_t n, uint8_t unit_flag, bool, bool c_matrix_source, bool c_matrix_init_val) {
  using namespace ascend_sim;
  constexpr int64_t E = sizeof(T), C0 = 32 / sizeof(T);
  char what[160];
  snprintf(what, sizeof what, "asc_mmad(L0C+%lld, L0A+%lld, L0B+%lld, m=%u, k=%u, n=%u)", (long long)c.offset,
           (long long)a.offset, (long long)b.offset, m, k, n);
  require(unit_flag == 0, what, "a unit flag");
  require(!c_matrix_source, what, "a bias source for C");
  if (k % C0) fail("%s: k is not a multiple of %lld", what, (long long)C0);
  const int64_t m16 = (m + 15) / 16 * 16, n16 = (n + 15) / 16 * 16;
  const int64_t a0 = a.offset, b0 = b.offset, c0 = c.offset;
  cube_bytes(MEM_L0A, a0, m16 * k * E, what);
  cube_bytes(MEM_L0B, b0, n16 * k * E, what);
  cube_bytes(MEM_L0C, c0, m16 * n16 * 4, what);
  // Row r, column q of an operand whose column blocks are rows16 rows apart.
  auto operand = [](int memory, int64_t base, int64_t rows16, int64_t r, int64_t q) {
    T x;
    memcpy(&x, cube_bytes(memory, base + ((q / C0) * rows16 + r) * 32 + (q % C0) * E, E, ""), E);
    return cube_operand(x);
  };
  issue(PIPE_M, Op{Op::WORK, 0, 0, 0, [=] {
                     for (int64_t i = 0; i < m; ++i)
                       for (int64_t j = 0; j < n; ++j) {
                         float *out = reinterpret_cast<float *>(
                             cube_bytes(MEM_L0C, c0 + (((j / 16) * m16 + i) * 16 + j % 16) * 4, 4, ""));
                         float acc = c_matrix_init_val ? 0.0f : *out;
                         for (int64_t q = 0; q < k; ++q)
                           acc = acc + operand(MEM_L0A, a0, m16, i, q) * operand(MEM_L0B, b0, n16, j, q);
                         *out = acc;
                       }
                   },
                   what});
}

// The L0C copies' NZ parameters (TileLang always emits (1, 0, 0): one matrix, no strides
// between matrices; ASSUMPTION: those are its fields).
inline void asc_set_l0c_copy_nz_para(uint16_t nd_num, uint16_t src_nd_stride, uint16_t dst_nd_stride) {
  if (nd_num != 1 || src_nd_stride || dst_nd_stride) ascend_sim::fail("asc_set_l0c_copy_nz_para: only (1, 0, 0) is modelled");
}

// L0C -> GM on the FIX pipe [TL]: an m_size x n_size fp32 matrix in ND, rows dst_stride
// elements apart.
inline void asc_copy_l0c2gm(float *dst, ascend_sim::cc_ptr<float> src, uint16_t n_size, uint16_t m_size,
                            uint32_t dst_stride, uint16_t src_stride, asc_store_l2_cache_mode, asc_unit_flag_mode unit_flag,
                            asc_quant_mode quant, asc_relu_pre_mode relu, bool split, bool nz2nd, bool nz2dn,
                            int clip_relu) {
  using namespace ascend_sim;
  char what[200];
  snprintf(what, sizeof what, "asc_copy_l0c2gm(L0C+%lld, n_size=%u, m_size=%u, dst_stride=%u, src_stride=%u)",
           (long long)src.offset, n_size, m_size, dst_stride, src_stride);
  float *gm = dst;
  auto check = [=] {
    for (int m = 0; m < m_size; ++m) check_gm((uintptr_t)(gm + (int64_t)m * dst_stride), (uint64_t)n_size * 4, what);
  };
  copy_l0c_to_nd(src, n_size, m_size, src_stride, nz2nd, quant, relu, unit_flag, split, nz2dn, clip_relu, what, check,
                 [=](int m, int n, float v) { gm[(int64_t)m * dst_stride + n] = v; });
}

// L0C -> the UB of AIV `sub_block` on the FIX pipe [TL]: ND, rows dst_stride elements apart.
inline void asc_copy_l0c2ub(ascend_sim::ub_ptr<float> dst, ascend_sim::cc_ptr<float> src, uint16_t n_size, uint16_t m_size,
                            uint32_t dst_stride, uint16_t src_stride, bool sub_block, asc_dual_dst_mode dual_dst,
                            asc_unit_flag_mode unit_flag, asc_quant_mode quant, asc_relu_pre_mode relu, bool split,
                            bool nz2nd, bool nz2dn, int clip_relu) {
  using namespace ascend_sim;
  char what[200];
  snprintf(what, sizeof what, "asc_copy_l0c2ub(UB+%lld of AIV%d, L0C+%lld, n_size=%u, m_size=%u, dst_stride=%u)",
           (long long)dst.offset, (int)sub_block, (long long)src.offset, n_size, m_size, dst_stride);
  require(dual_dst == 0, what, "a dual destination");
  const int64_t ub0 = dst.offset;
  auto check = [=] {
    if (ub0 % 32) fail("%s: UB address not 32-byte aligned", what);
    const int64_t last = ub0 + (((int64_t)m_size - 1) * dst_stride + n_size) * 4;
    if (m_size && n_size && (ub0 < 0 || last > MX.ub_alloc))
      fail("%s: UB bytes [%lld, %lld) outside the kernel's UB allocation [0, %lld)", what, (long long)ub0,
           (long long)last, (long long)MX.ub_alloc);
  };
  const int target = UNIT_AIV0 + (int)sub_block;
  copy_l0c_to_nd(src, n_size, m_size, src_stride, nz2nd, quant, relu, unit_flag, split, nz2dn, clip_relu, what, check,
                 [=](int m, int n, float v) {
                   memcpy(instance_ub(target) + ub0 + ((int64_t)m * dst_stride + n) * 4, &v, 4);
                 });
}
