// ascend-api-check prelude: what the bisheng (CCE) compiler provides. Nothing from asc-devkit.
#pragma once
#include <cstdint>
#include <cstddef>
#define __aicore__
#define __global__
#define __vector__
#define __cube__
#define __mix__(...)
#define __host__
#define __host_aicore__
#define __disable_kernel_type_autoinfer__
#define __simd_vf__
#define __simd_callee__
#define __simt_vf__
#define __simt_callee__
#define __callee__
#define __launch_bounds__(...)
// address spaces: distinct clang address spaces, so a __gm__/__ubuf__ mix-up is a type error
#define __gm__ __attribute__((address_space(1)))
#define __cbuf__ __attribute__((address_space(2)))
#define __ca__ __attribute__((address_space(3)))
#define __cb__ __attribute__((address_space(4)))
#define __cc__ __attribute__((address_space(5)))
#define __ubuf__ __attribute__((address_space(6)))
#define __fbuf__ __attribute__((address_space(7)))
#define __ssbuf__ __attribute__((address_space(8)))
#define __biasbuf__ __attribute__((address_space(9)))
// builtin scalar types
typedef _Float16 half;
struct __apicheck_bf16 { uint16_t __bits; __apicheck_bf16() = default; template <class T> __apicheck_bf16(T); operator float() const; };
typedef __apicheck_bf16 bfloat16_t;
template <int K> struct __apicheck_narrow_fp {
  uint8_t __bits; __apicheck_narrow_fp() = default; template <class T> __apicheck_narrow_fp(T); operator float() const; };
typedef __apicheck_narrow_fp<1> float8_e4m3_t;
typedef __apicheck_narrow_fp<2> float8_e5m2_t;
typedef __apicheck_narrow_fp<3> float8_e8m0_t;
typedef __apicheck_narrow_fp<4> float4_e2m1x2_t;
typedef __apicheck_narrow_fp<5> float4_e1m2x2_t;
typedef __apicheck_narrow_fp<6> hifloat8_t;
// builtin register types: distinct, no conversions between them
template <int K> struct __apicheck_vreg { };
typedef __apicheck_vreg<1> vector_u8;   typedef __apicheck_vreg<2> vector_u16;
typedef __apicheck_vreg<3> vector_u32;  typedef __apicheck_vreg<4> vector_u64;
typedef __apicheck_vreg<5> vector_s8;   typedef __apicheck_vreg<6> vector_s16;
typedef __apicheck_vreg<7> vector_s32;  typedef __apicheck_vreg<8> vector_s64;
typedef __apicheck_vreg<9> vector_bf16; typedef __apicheck_vreg<10> vector_f16;
typedef __apicheck_vreg<11> vector_f32; typedef __apicheck_vreg<12> vector_hif8;
typedef __apicheck_vreg<13> vector_f8e4m3; typedef __apicheck_vreg<14> vector_f8e5m2;
typedef __apicheck_vreg<15> vector_f8e8m0; typedef __apicheck_vreg<16> vector_s4x2;
typedef __apicheck_vreg<17> vector_f4e2m1x2; typedef __apicheck_vreg<18> vector_f4e1m2x2;
typedef __apicheck_vreg<19> vector_align; typedef __apicheck_vreg<20> vector_address;
typedef __apicheck_vreg<21> vector_bool;
// result of a learned intrinsic / value of a learned builtin constant: converts to anything
struct __apicheck_any { template <class T> constexpr operator T() const { return T(); } };
// a learned builtin constant: its own empty tag type (so `if constexpr (param == CONSTANT)` on a
// by-value parameter works, as in bisheng), comparable with other tags, convertible to anything
template <int N> struct __apicheck_tag { template <class T> constexpr operator T() const { return T(); } };
template <int A, int B> constexpr bool operator==(__apicheck_tag<A>, __apicheck_tag<B>) { return A == B; }
template <int A, int B> constexpr bool operator!=(__apicheck_tag<A>, __apicheck_tag<B>) { return A != B; }
enum class ROUND : int { R, A, F, C, Z, O, H, CAST_RINT, CAST_ROUND, CAST_FLOOR, CAST_CEIL, CAST_TRUNC, CAST_ODD, CAST_HYBRID };
// the compiler's vector structs of the SIMT API
struct char2 { signed char x, y; }; struct char3 { signed char x, y, z; }; struct char4 { signed char x, y, z, w; };
struct uchar2 { unsigned char x, y; }; struct uchar3 { unsigned char x, y, z; }; struct uchar4 { unsigned char x, y, z, w; };
struct short2 { short x, y; }; struct short3 { short x, y, z; }; struct short4 { short x, y, z, w; };
struct ushort2 { unsigned short x, y; }; struct ushort3 { unsigned short x, y, z; }; struct ushort4 { unsigned short x, y, z, w; };
struct int2 { int x, y; }; struct int3 { int x, y, z; }; struct int4 { int x, y, z, w; };
struct uint2 { unsigned int x, y; }; struct uint3 { unsigned int x, y, z; }; struct uint4 { unsigned int x, y, z, w; };
struct long2 { long x, y; }; struct long3 { long x, y, z; }; struct long4 { long x, y, z, w; };
struct ulong2 { unsigned long x, y; }; struct ulong3 { unsigned long x, y, z; }; struct ulong4 { unsigned long x, y, z, w; };
struct longlong2 { long long x, y; }; struct longlong3 { long long x, y, z; }; struct longlong4 { long long x, y, z, w; };
struct ulonglong2 { unsigned long long x, y; }; struct ulonglong3 { unsigned long long x, y, z; }; struct ulonglong4 { unsigned long long x, y, z, w; };
struct float2 { float x, y; }; struct float3 { float x, y, z; }; struct float4 { float x, y, z, w; };
struct double2 { double x, y; }; struct double3 { double x, y, z; }; struct double4 { double x, y, z, w; };
struct half2 { half x, y; };
struct bfloat16x2_t { bfloat16_t x, y; };
struct __apicheck_dim3 { uint32_t x, y, z; };
extern const __apicheck_dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int32_t warpSize = 32;
extern int64_t block_idx; extern int64_t block_num;
namespace cce { struct dim3 { uint32_t x = 1, y = 1, z = 1; dim3(uint32_t a = 1, uint32_t b = 1, uint32_t c = 1) : x(a), y(b), z(c) {} };
  template <auto F, class... A> void async_invoke(dim3, A&&...); }
namespace bisheng { namespace cce { void metrics_prof_start(); void metrics_prof_stop(); template <class... A> void mark_stamp(A&&...); } }
// pset pattern modes (listed in asc-devkit include/c_api/reg_compute/reg_vector.h's comment; a compiler enum)
enum __apicheck_pat_mode { PAT_ALL, PAT_VL1, PAT_VL2, PAT_VL3, PAT_VL4, PAT_VL8, PAT_VL16, PAT_VL32, PAT_VL64, PAT_VL128, PAT_M3, PAT_M4, PAT_H, PAT_Q, PAT_ALLF = 15 };
// hardware pipes (compiler enum pipe_t; asc-devkit names pipe_t::PIPE_S/V/MTE2/MTE3/ALL, the rest are CCE's)
enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_MTE4, PIPE_MTE5, PIPE_V2, PIPE_FIX };
// mem_bar kinds (listed in asc-devkit include/c_api/reg_compute/reg_vector.h's comment on asc_mem_bar; a compiler enum)
enum __apicheck_mem_bar { VV_ALL, VST_VLD, VLD_VST, VST_VST, VS_ALL, VST_LD, VLD_ST, VST_ST, SV_ALL, ST_VLD, LD_VST, ST_VST, SS_ALL, ST_LD, LD_ST, ST_ST };
// SIMT conversion documented in asc-devkit docs/ (SIMT-API, half) but declared by the compiler
float2 __half22float2(half2);
#include "apicheck_learned.h"  // written by the check: the built-ins it learned
