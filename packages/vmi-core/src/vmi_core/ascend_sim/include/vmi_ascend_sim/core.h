// vmi ascend-sim: launch state, errors, and bounds-checked Unified Buffer and
// Global Memory pointers.
//
// The emitted AscendC is compiled with every `__ubuf__ T*` spelled `ub_ptr<T>` and
// every `__gm__ T*` spelled `gm_ptr<T>` (a textual rewrite done before compiling),
// so each UB and GM access of scalar and SIMT code goes through a check:
//  * UB: inside the kernel's UB allocation (the merged UB buffer TileLang sizes,
//    `dyn_shared_memory_buf`), which itself must fit the usable UB of the core
//    (248 KiB, or 216 KiB with a SIMT region: GetRuntimeUBSize, CANN 9.x
//    "atlasascendc_api_07_00190"; 256 KiB UB less 8 KiB reserved less >= 32 KiB SIMT
//    data cache, asc-devkit SIMT programming guide "memory hierarchy"), and
//    naturally aligned;
//  * GM: inside one of the tensors passed to the launch.
// A failed check throws `Error`; the runner turns it into an error message naming
// the kernel, core, SIMT thread and address.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace ascend_sim {

struct Error : std::exception {
  std::string message;
  explicit Error(std::string m) : message(std::move(m)) {}
  const char *what() const noexcept override { return message.c_str(); }
};

struct GmRegion {
  uintptr_t lo, hi;
  const char *name;
};

// Where code runs: scalar code of the kernel, a SIMT region, or a SIMD (`__simd_vf__`) region.
enum Region { REGION_SCALAR = 0, REGION_SIMT = 1, REGION_SIMD = 2 };

// Execution counts of one launch, summed over its cores (vmi_core.ascend_sim reads them in
// this order). A vector instruction is one call of a modelled SIMD intrinsic, loads and stores
// included, asc_mem_bar not; UB accesses are element accesses through ub_ptr (scalar and SIMT
// code, never DMA or vector loads and stores); DMA bytes are the bytes of the GM side.
struct Stats {
  uint64_t cores;
  uint64_t simd_regions, simt_regions, simt_threads;
  uint64_t vector_instructions, vector_loads, vector_stores, mem_bars;
  uint64_t ub_accesses[3];  // by Region
  uint64_t dma_gm_to_ub_bytes, dma_ub_to_gm_bytes;
};

struct Launch {
  const char *kernel = "";
  int core = -1;
  int num_cores = 0;
  int thread = -1;  // SIMT thread running now, -1 on the scalar unit
  int unit = -1;    // core of a mixed kernel's AI core running now (mix.h): 0 AIC, 1 AIV0, 2 AIV1
  Region region = REGION_SCALAR;
  Stats stats{};
  uint8_t *ub = nullptr;
  int64_t ub_alloc = 0;  // bytes of the kernel's UB allocation
  std::vector<GmRegion> gm;
  uint64_t rng = 1;
};

inline Launch L;

[[noreturn]] inline void fail(const char *fmt, ...) {
  char body[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  static const char *units[] = {" (AIC)", " (AIV0)", " (AIV1)"};
  const char *unit = L.unit >= 0 ? units[L.unit] : "";
  char where[160];
  if (L.thread >= 0)
    snprintf(where, sizeof where, "kernel %s, core %d of %d%s, SIMT thread %d", L.kernel, L.core, L.num_cores, unit,
             L.thread);
  else
    snprintf(where, sizeof where, "kernel %s, core %d of %d%s", L.kernel, L.core, L.num_cores, unit);
  throw Error(std::string(where) + ": " + body);
}

inline uint64_t random_u64() {  // xorshift64*: a fixed, seedable stream
  uint64_t x = L.rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  L.rng = x;
  return x * 0x2545F4914F6CDD1DULL;
}

inline void check_ub(int64_t offset, int64_t bytes, int64_t align, const char *what) {
  if (offset < 0 || offset + bytes > L.ub_alloc)
    fail("%s: UB bytes [%lld, %lld) outside the kernel's UB allocation [0, %lld)", what, (long long)offset,
         (long long)(offset + bytes), (long long)L.ub_alloc);
  if (offset % align != 0) fail("%s: UB byte offset %lld is not %lld-byte aligned", what, (long long)offset,
                                (long long)align);
}

inline int find_gm(uintptr_t address, uint64_t bytes) {
  for (size_t r = 0; r < L.gm.size(); ++r)
    if (address >= L.gm[r].lo && address + bytes <= L.gm[r].hi) return (int)r;
  return -1;
}

[[noreturn]] inline void fail_gm(uintptr_t address, uint64_t bytes, const char *what) {
  for (auto &r : L.gm)
    if (address + bytes > r.lo && address < r.hi + 65536)
      fail("%s: GM bytes [%lld, %lld) relative to tensor %s of %llu bytes are out of bounds", what,
           (long long)(address - r.lo), (long long)(address + bytes - r.lo), r.name,
           (unsigned long long)(r.hi - r.lo));
  fail("%s: GM address %#llx (+%llu bytes) is in no tensor of the launch", what, (unsigned long long)address,
       (unsigned long long)bytes);
}

inline void check_gm(uintptr_t address, uint64_t bytes, const char *what) {
  if (find_gm(address, bytes) < 0) fail_gm(address, bytes, what);
}

// A Unified Buffer address: a byte offset into the running core's UB.
template <class T>
struct ub_ptr {
  int64_t offset = 0;

  ub_ptr() = default;
  explicit ub_ptr(int byte_offset) : offset(byte_offset) {}  // `(__ubuf__ uint8_t *)0`: the UB base
  template <class U>
  explicit ub_ptr(ub_ptr<U> other) : offset(other.offset) {}

  T &operator[](int64_t i) const {
    int64_t at = offset + i * (int64_t)sizeof(T);
    check_ub(at, sizeof(T), alignof(T), "UB access");
    ++L.stats.ub_accesses[L.region];
    return *reinterpret_cast<T *>(L.ub + at);
  }
  T &operator*() const { return (*this)[0]; }
  ub_ptr operator+(int64_t i) const {
    ub_ptr p;
    p.offset = offset + i * (int64_t)sizeof(T);
    return p;
  }
  uint8_t *host() const { return L.ub + offset; }
};

// A Global Memory address: a host pointer into one of the launch's tensors.
template <class T>
struct gm_ptr {
  T *address = nullptr;

  gm_ptr() = default;
  template <class U>
  explicit gm_ptr(U *host) : address(reinterpret_cast<T *>(host)) {}
  template <class U>
  explicit gm_ptr(gm_ptr<U> other) : address(reinterpret_cast<T *>(other.address)) {}

  T &operator[](int64_t i) const {
    T *element = address + i;
    check_gm((uintptr_t)element, sizeof(T), "GM access");
    return *element;
  }
  T &operator*() const { return (*this)[0]; }
  gm_ptr operator+(int64_t i) const { return gm_ptr(address + i); }
};

}  // namespace ascend_sim
