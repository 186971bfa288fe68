// vmi ascend-sim: SIMT vector regions.
//
// `asc_vf_call<F>(dim3(n), args...)` runs F on n SIMT threads (asc-devkit SIMT
// programming guide; TileLang emits n = the region's thread count). Each thread is a
// fiber with its own stack, so locals are per thread; `asc_syncthreads()` is a real
// barrier: a thread stops there until every live thread has reached the same
// barrier. A thread that returns while others wait at a barrier, or threads waiting at
// different barriers, is an error (barrier divergence). Under the queued schedules the
// thread order of every phase between barriers is shuffled, so a missing barrier shows
// up as wrong data.
#pragma once

#include <ucontext.h>

#include <algorithm>

#include "pipes.h"

namespace cce {
struct dim3 {
  uint32_t x, y, z;
  constexpr dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};
}  // namespace cce

namespace ascend_sim {

constexpr int MAX_SIMT_THREADS = 2048;
constexpr size_t FIBER_STACK_BYTES = 128 * 1024;

struct Fiber {
  ucontext_t context;
  enum State { RUNNABLE, AT_BARRIER, DONE } state;
  int barrier_site;
};

struct Simt {
  std::vector<Fiber> fibers;
  std::vector<char> stacks;
  ucontext_t scheduler;
  const std::function<void()> *body = nullptr;
  std::exception_ptr error;
};

inline Simt T;

inline void fiber_main() {
  try {
    (*T.body)();
  } catch (...) {
    T.error = std::current_exception();
  }
  T.fibers[L.thread].state = Fiber::DONE;
  swapcontext(&T.fibers[L.thread].context, &T.scheduler);
}

inline void syncthreads(int site) {
  if (L.thread < 0) fail("asc_syncthreads() outside a SIMT region");
  Fiber &f = T.fibers[L.thread];
  f.state = Fiber::AT_BARRIER;
  f.barrier_site = site;
  swapcontext(&f.context, &T.scheduler);
}

inline void run_simt(int n, const std::function<void()> &body) {
  if (n <= 0 || n > MAX_SIMT_THREADS) fail("asc_vf_call with %d threads (1 to %d)", n, MAX_SIMT_THREADS);
  ++L.stats.simt_regions;
  L.stats.simt_threads += n;
  L.region = REGION_SIMT;  // a failed check ends the launch, which resets it
  if ((int)T.fibers.size() < n) {
    T.fibers.resize(n);
    T.stacks.assign((size_t)n * FIBER_STACK_BYTES, 0);
  }
  T.body = &body;
  T.error = nullptr;
  for (int t = 0; t < n; ++t) {
    Fiber &f = T.fibers[t];
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = T.stacks.data() + (size_t)t * FIBER_STACK_BYTES;
    f.context.uc_stack.ss_size = FIBER_STACK_BYTES;
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_main, 0);
    f.state = Fiber::RUNNABLE;
  }
  std::vector<int> order(n);
  for (int t = 0; t < n; ++t) order[t] = t;
  for (;;) {
    if (P.schedule != SCHEDULE_SEQ)
      for (int i = n - 1; i > 0; --i) std::swap(order[i], order[random_u64() % (i + 1)]);
    for (int t : order) {
      if (T.fibers[t].state != Fiber::RUNNABLE) continue;
      L.thread = t;
      swapcontext(&T.scheduler, &T.fibers[t].context);
      L.thread = -1;
      if (T.error) std::rethrow_exception(T.error);
    }
    int done = 0, waiting = 0, site = -1;
    bool mixed = false;
    for (int t = 0; t < n; ++t) {
      if (T.fibers[t].state == Fiber::DONE) {
        ++done;
        continue;
      }
      ++waiting;
      if (site < 0) site = T.fibers[t].barrier_site;
      mixed |= site != T.fibers[t].barrier_site;
    }
    if (waiting == 0) {
      L.region = REGION_SCALAR;
      return;
    }
    if (done > 0)
      fail("SIMT barrier divergence: %d of %d threads returned while %d wait at asc_syncthreads (line %d)", done, n,
           waiting, site);
    if (mixed) fail("SIMT barrier divergence: threads wait at different asc_syncthreads calls");
    for (int t = 0; t < n; ++t) T.fibers[t].state = Fiber::RUNNABLE;
  }
}

inline cce::dim3 thread_idx() { return cce::dim3((uint32_t)L.thread, 0, 0); }

}  // namespace ascend_sim
