// vmi ascend-sim: the AscendC C API subset that TileLang 0.1.15's `ascend` target
// emits, modelled on the host. It replaces <tl_templates/ascend/common.h>; nothing
// here comes from CANN. An intrinsic that is not modelled here is a compile error.
//
// Sources (cited beside each model below):
//  [D3510]  asc-devkit docs/zh/api/SIMD-API/C-API/vector_datamove/asc_copy_{gm2ub,ub2gm}_align,
//           the Ascend 950 (arch 3510) C API pages (as of asc-devkit 0da921b, July 2026);
//  [C310]   asc-devkit impl/basic_api/dav_c310/kernel_operator_data_copy_impl.h,
//           CopyGmToUbufAlignV2 / CopyUbufToGmAlignV2 (how AscendC builds the v2 arguments);
//  [CCE]    CANN cceintrinsicapi copy_gm_to_ubuf_align / copy_ubuf_to_gm_align;
//  [TL]     tilelang 0.1.15 src/ascend/codegen/codegen_ascend.cc and op/builtin.h
//           (argument order of the emitted calls);
//  [SIMT]   asc-devkit SIMT programming guide (threads, asc_syncthreads, UB layout).
// Open points are ASSUMPTIONS, listed in vmi-core's README ("ascend-sim assumptions").
#pragma once

#include <cmath>
#include <type_traits>

#include "simt.h"

#define __global__
#define __vector__
#define __aicore__
#define __simt_vf__
#define __simt_callee__  // a function a SIMT region calls [SIMT]
#define __launch_bounds__(n)

typedef unsigned int uint;
typedef unsigned char uchar;
typedef unsigned short ushort;

// The short vector types of vectorised SIMT accesses (TileLang emits float2 loads and
// stores of UB), aligned to their size as the SIMT data types are [SIMT].
#define VMI_ASCEND_SIM_VECTOR_TYPES(T, N2, N4)                                          \
  struct alignas(2 * sizeof(T)) N2 { T x, y; };                                       \
  struct alignas(4 * sizeof(T)) N4 { T x, y, z, w; };                                 \
  inline N2 make_##N2(T x, T y) { return N2{x, y}; }                                   \
  inline N4 make_##N4(T x, T y, T z, T w) { return N4{x, y, z, w}; }
VMI_ASCEND_SIM_VECTOR_TYPES(float, float2, float4)
VMI_ASCEND_SIM_VECTOR_TYPES(int32_t, int2, int4)
VMI_ASCEND_SIM_VECTOR_TYPES(uint32_t, uint2, uint4)
#undef VMI_ASCEND_SIM_VECTOR_TYPES

enum asc_load_l2_cache_mode { ASC_LOAD_L2_DISABLE = 0, ASC_LOAD_L2_NORMAL = 1, ASC_LOAD_L2_LAST = 2 };
enum asc_store_l2_cache_mode { ASC_STORE_L2_DISABLE = 0, ASC_STORE_L2_NORMAL = 1, ASC_STORE_L2_LAST = 2 };

#define threadIdx (::ascend_sim::thread_idx())
#define asc_syncthreads() ::ascend_sim::syncthreads(__LINE__)

// max/min of integers only, as the arch-3510 SIMT API declares them (asc-devkit
// include/simt_api/math_functions.h): a float max/min does not compile here either (vmi's
// lane layer compares and selects floats, vmi_core.tl.simd.minimum/maximum).
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  static_assert(std::is_integral_v<C>, "the SIMT API declares integer max only");
  return (C)a > (C)b ? (C)a : (C)b;
}
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  static_assert(std::is_integral_v<C>, "the SIMT API declares integer min only");
  return (C)a < (C)b ? (C)a : (C)b;
}

// The running core. An object rather than a macro: TileLang passes it to __simd_vf__
// functions as a parameter of the same name, which then shadows it.
struct BlockIdx {
  operator int32_t() const { return ascend_sim::L.core; }
};
inline constexpr BlockIdx block_idx{};

inline void asc_init() {}

// set_flag on the source pipe, wait_flag on the destination pipe (pipes.h).
inline void asc_sync_notify(pipe_t src, pipe_t dst, event_t event) {
  using namespace ascend_sim;
  if ((int)event < 0 || (int)event >= NUM_EVENTS) fail("asc_sync_notify: event id %d outside [0, 8)", (int)event);
  issue(src, Op{Op::NOTIFY, (int)src, (int)dst, (int)event, {}, "set_flag " + flag_name(src, dst, event)});
}

inline void asc_sync_wait(pipe_t src, pipe_t dst, event_t event) {
  using namespace ascend_sim;
  if ((int)event < 0 || (int)event >= NUM_EVENTS) fail("asc_sync_wait: event id %d outside [0, 8)", (int)event);
  issue(dst, Op{Op::WAIT, (int)src, (int)dst, (int)event, {}, "wait_flag " + flag_name(src, dst, event)});
}

// pipe_barrier(pipe): earlier operations of `pipe` complete before later ones start.
// Each queue is in order already; PIPE_ALL waits for every pipe.
inline void asc_sync_pipe(pipe_t pipe) {
  if (pipe == PIPE_ALL && ascend_sim::P.schedule != ascend_sim::SCHEDULE_SEQ) ascend_sim::drain("pipe_barrier(PIPE_ALL)");
}

namespace ascend_sim {

constexpr uint32_t MAX_BURSTS = 4095;        // [D3510] n_burst in [1, 4095]
constexpr uint32_t MAX_BURST_BYTES = 2097151;  // [D3510] len_burst in [1, 2^21 - 1]
constexpr uint32_t BLOCK_BYTES = 32;           // UB side of a burst: whole 32-byte blocks

inline uint64_t round_up_block(uint64_t bytes) { return (bytes + BLOCK_BYTES - 1) / BLOCK_BYTES * BLOCK_BYTES; }

// The limits both DMA directions share [D3510]: burst count and length, whole elements, a
// 32-byte aligned UB side, a UB stride of whole blocks, GM aligned to its elements. The UB
// stride rule is stricter than [D3510], which allows an unaligned one equal to len_burst
// (bursts back to back): a vmi choice, listed in the README's assumptions.
inline void check_bursts(const char *what, uint32_t n_burst, uint32_t len_burst, uint32_t element_bytes,
                         int64_t ub_offset, uint32_t ub_stride, uintptr_t gm_address) {
  if (n_burst < 1 || n_burst > MAX_BURSTS) fail("%s: n_burst outside [1, %u]", what, MAX_BURSTS);
  if (len_burst < 1 || len_burst > MAX_BURST_BYTES) fail("%s: len_burst outside [1, %u]", what, MAX_BURST_BYTES);
  if (len_burst % element_bytes) fail("%s: len_burst is not a whole number of %u-byte elements", what, element_bytes);
  if (ub_offset % BLOCK_BYTES) fail("%s: UB address not 32-byte aligned", what);
  if (n_burst > 1 && ub_stride % BLOCK_BYTES) fail("%s: UB stride not a multiple of 32 bytes", what);
  if (gm_address % element_bytes) fail("%s: GM address not aligned to its %u-byte elements", what, element_bytes);
}

}  // namespace ascend_sim

// GM -> UB on MTE2 [D3510][TL]: burst i copies len_burst bytes from src + i*src_stride to
// dst + i*dst_stride, after left_pad pad elements; strides are start-to-start distances
// in bytes [D3510] ([C310] builds them as gap + burst). The UB side of a burst is
// left_pad + len + right_pad bytes rounded up to 32: pads hold the constant pad value or the burst's first element, the rounding
// bytes copies of the first element [CCE] (ASSUMPTION: the same for arch 3510).
template <class T>
inline void asc_copy_gm2ub_align(ascend_sim::ub_ptr<T> dst, ascend_sim::gm_ptr<T> src, uint32_t n_burst,
                                 uint32_t len_burst, uint32_t left_pad, uint32_t right_pad, bool constant_pad,
                                 asc_load_l2_cache_mode, uint64_t src_stride, uint32_t dst_stride) {
  using namespace ascend_sim;
  constexpr uint32_t E = sizeof(T);
  char what[200];
  snprintf(what, sizeof what, "asc_copy_gm2ub_align(ub+%lld, n_burst=%u, len_burst=%u, src_stride=%llu, dst_stride=%u)",
           (long long)dst.offset, n_burst, len_burst, (unsigned long long)src_stride, dst_stride);
  check_bursts(what, n_burst, len_burst, E, dst.offset, dst_stride, (uintptr_t)src.address);
  if (left_pad * E > BLOCK_BYTES || right_pad * E > BLOCK_BYTES) fail("%s: a pad of over 32 bytes", what);
  const uint64_t span = round_up_block((uint64_t)(left_pad + right_pad) * E + len_burst);
  const uint8_t *gm = reinterpret_cast<const uint8_t *>(src.address);
  for (uint32_t i = 0; i < n_burst; ++i) {  // addresses are fixed at issue: check them now
    check_gm((uintptr_t)(gm + (uint64_t)i * src_stride), len_burst, what);
    check_ub(dst.offset + (int64_t)i * dst_stride, span, BLOCK_BYTES, what);
  }
  L.stats.dma_gm_to_ub_bytes += (uint64_t)n_burst * len_burst;
  const int64_t ub0 = dst.offset;
  issue(PIPE_MTE2, Op{Op::WORK, 0, 0, 0, [=] {
                        for (uint32_t i = 0; i < n_burst; ++i) {
                          const uint8_t *from = gm + (uint64_t)i * src_stride;
                          uint8_t *to = L.ub + ub0 + (int64_t)i * dst_stride;
                          uint8_t first[E], pad[E];
                          memcpy(first, from, E);
                          if (constant_pad) memset(pad, 0, E);  // ASSUMPTION: the pad value register holds 0
                          else memcpy(pad, first, E);
                          uint64_t at = 0;
                          for (uint32_t k = 0; k < left_pad; ++k, at += E) memcpy(to + at, pad, E);
                          memcpy(to + at, from, len_burst);
                          at += len_burst;
                          for (uint32_t k = 0; k < right_pad; ++k, at += E) memcpy(to + at, pad, E);
                          for (; at < span; ++at) to[at] = first[at % E];
                        }
                      },
                      what});
}

// UB -> GM on MTE3 [D3510][TL]: burst i reads len_burst bytes at src + i*src_stride and
// writes them to dst + i*dst_stride; strides start to start in bytes [D3510], as above.
template <class T>
inline void asc_copy_ub2gm_align(ascend_sim::gm_ptr<T> dst, ascend_sim::ub_ptr<T> src, uint32_t n_burst,
                                 uint32_t len_burst, asc_store_l2_cache_mode, uint64_t dst_stride,
                                 uint32_t src_stride) {
  using namespace ascend_sim;
  constexpr uint32_t E = sizeof(T);
  char what[200];
  snprintf(what, sizeof what, "asc_copy_ub2gm_align(ub+%lld, n_burst=%u, len_burst=%u, dst_stride=%llu, src_stride=%u)",
           (long long)src.offset, n_burst, len_burst, (unsigned long long)dst_stride, src_stride);
  check_bursts(what, n_burst, len_burst, E, src.offset, src_stride, (uintptr_t)dst.address);
  uint8_t *gm = reinterpret_cast<uint8_t *>(dst.address);
  for (uint32_t i = 0; i < n_burst; ++i) {
    check_ub(src.offset + (int64_t)i * src_stride, len_burst, BLOCK_BYTES, what);
    check_gm((uintptr_t)(gm + (uint64_t)i * dst_stride), len_burst, what);
  }
  L.stats.dma_ub_to_gm_bytes += (uint64_t)n_burst * len_burst;
  const int64_t ub0 = src.offset;
  issue(PIPE_MTE3, Op{Op::WORK, 0, 0, 0, [=] {
                        for (uint32_t i = 0; i < n_burst; ++i)
                          memcpy(gm + (uint64_t)i * dst_stride, L.ub + ub0 + (int64_t)i * src_stride, len_burst);
                      },
                      what});
}

// A SIMT region on the V pipe [SIMT][TL]: arguments are captured at issue, the threads
// run when the V pipe reaches the call.
template <auto F, class... Args>
inline void asc_vf_call(cce::dim3 dims, Args... args) {
  using namespace ascend_sim;
  const int n = (int)(dims.x * dims.y * dims.z);
  issue(PIPE_V, Op{Op::WORK, 0, 0, 0, [=] { run_simt(n, [&] { F(args...); }); }, "asc_vf_call"});
}
