// vmi ascend-sim: one launch of a kernel over its cores.
//
// The cores run one after another, each with its own Unified Buffer, filled with
// random bytes before the core starts so that a read of UB nothing wrote shows up as a
// mismatch, and its own pipes and events. The AI cores of a Cube or mixed kernel run their
// AIC, and for a mixed kernel their two AIVs too (`mix.h`), with random L1 and L0 contents and
// a random UB per AIV.
// A failed check anywhere ends the launch with the message of the first error. `stats`
// receives the launch's execution counts.
#pragma once

#include "asc_api.h"
#include "cube.h"

namespace ascend_sim {

enum KernelKind { KERNEL_VECTOR, KERNEL_CUBE, KERNEL_MIX };

struct LaunchConfig {
  int32_t num_cores;
  int32_t schedule;
  int64_t ub_alloc;     // bytes of the kernel's UB allocation
  int64_t ub_capacity;  // usable UB of one core for this kernel
  uint64_t seed;
};

template <class KernelCall>
int run_launch(const char *kernel, const LaunchConfig &config, const GmRegion *regions, int num_regions,
               KernelCall call, Stats *stats, char *error, size_t error_bytes, KernelKind kind) {
  L = Launch{};
  L.kernel = kernel;
  L.num_cores = config.num_cores;
  L.gm.assign(regions, regions + num_regions);
  L.rng = config.seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
  P.schedule = config.schedule;
  static std::vector<uint64_t> ub_words;
  try {
    if (config.ub_alloc > config.ub_capacity)
      fail("the kernel's UB allocation of %lld bytes exceeds the %lld bytes of UB it may use",
           (long long)config.ub_alloc, (long long)config.ub_capacity);
    if (kind != KERNEL_VECTOR) {
      MX.ub_alloc = config.ub_alloc;
      const std::function<void()> body = call;
      for (int core = 0; core < config.num_cores; ++core) {
        L.core = core;
        ++L.stats.cores;
        C.reset();
        P.reset();
        run_ai_core(body, kind == KERNEL_MIX);
      }
      *stats = L.stats;
      return 0;
    }
    ub_words.assign((size_t)(config.ub_alloc + 7) / 8 + 1, 0);
    L.ub = reinterpret_cast<uint8_t *>(ub_words.data());
    L.ub_alloc = config.ub_alloc;
    for (int core = 0; core < config.num_cores; ++core) {
      L.core = core;
      ++L.stats.cores;
      for (auto &word : ub_words) word = random_u64();
      P.reset();
      call();
      finish_core();
    }
  } catch (const Error &e) {
    snprintf(error, error_bytes, "%s", e.what());
    return 1;
  }
  *stats = L.stats;
  return 0;
}

}  // namespace ascend_sim
