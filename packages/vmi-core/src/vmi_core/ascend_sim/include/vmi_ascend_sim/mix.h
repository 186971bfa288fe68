// vmi ascend-sim: the AI core of a mixed kernel (`__mix__(1, 2)`), and of a Cube kernel
// (`__cube__`: the AIC alone).
//
// On Ascend 950 an AI core is one Cube core (AIC) and two vector cores (AIV), and a mixed
// kernel runs its entry once on each of them: `ASC_IS_AIC` / `ASC_IS_AIV` select the code of
// the running core and `asc_get_sub_block_id()` tells the two AIVs apart (asc-devkit
// "block_subblock_relationship_3510"; TileLang emits `__mix__(1, 2)` for one AIC and two
// AIVs). The model runs the three as fibers of one AI core, each with its own pipes and
// flags (`pipes.h`) and each AIV with its own Unified Buffer; the AIC owns L1 and L0
// (`cube.h`). They share GM and meet through the cross-core counters of
// `asc_sync_intra_arrive` / `asc_sync_intra_wait`: an instance runs until one of its waits
// needs a counter only another instance can raise, then the others run. Under the queued
// schedules the instances take turns in a random order, so a missing cross-core wait lets a
// consumer read what its producer has not written yet (random bytes) and shows up as wrong
// data; a round in which no instance can advance is a deadlock.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <utility>

#include "pipes.h"

namespace ascend_sim {

enum Unit { UNIT_AIC = 0, UNIT_AIV0 = 1, UNIT_AIV1 = 2 };

constexpr size_t INSTANCE_STACK_BYTES = 8 << 20;

inline const char *unit_name(int unit) {
  static const char *names[NUM_INSTANCES] = {"AIC", "AIV0", "AIV1"};
  return names[unit];
}

struct Instance {
  ucontext_t context;
  std::vector<char> stack;
  Pipes pipes;                 // this instance's pipes while another one runs
  std::vector<uint64_t> ub;    // an AIV's Unified Buffer (the AIC has none)
  bool done = false;
  std::exception_ptr error;
};

struct Mix {
  bool active = false;  // the launch runs a mixed kernel
  Instance instance[NUM_INSTANCES];
  ucontext_t scheduler;
  const std::function<void()> *body = nullptr;
  int64_t ub_alloc = 0;
};

inline Mix MX;

inline uint8_t *instance_ub(int unit) { return reinterpret_cast<uint8_t *>(MX.instance[unit].ub.data()); }

// Make `unit` the running instance: its pipes in P, its UB (none for the AIC) in L.
inline void enter(int unit) {
  std::swap(P, MX.instance[unit].pipes);
  X.unit = unit;
  L.unit = unit;
  L.ub = unit == UNIT_AIC ? nullptr : instance_ub(unit);
  L.ub_alloc = unit == UNIT_AIC ? 0 : MX.ub_alloc;
}

inline void leave(int unit) {
  std::swap(P, MX.instance[unit].pipes);
  L.unit = -1;
}

// Called by the running instance when it cannot advance: the scheduler runs the others.
inline bool yield_to_other_instances() {
  Instance &self = MX.instance[X.unit];
  swapcontext(&self.context, &MX.scheduler);
  return true;  // the scheduler resumes an instance only after some instance advanced
}

inline void instance_main() {
  Instance &self = MX.instance[X.unit];
  try {
    (*MX.body)();
    finish_core();
  } catch (...) {
    self.error = std::current_exception();
  }
  self.done = true;
  swapcontext(&self.context, &MX.scheduler);
}

inline std::string blocked_instances() {
  std::string text;
  for (int u = 0; u < NUM_INSTANCES; ++u) {
    if (MX.instance[u].done) continue;
    enter(u);
    text += std::string(" ") + unit_name(u) + ":" + blocked_pipes();
    leave(u);
  }
  return text;
}

// One AI core: its AIC, and with `vector_cores` AIV0 and AIV1, from their first statement to their end.
inline void run_ai_core(const std::function<void()> &body, bool vector_cores) {
  MX.body = &body;
  memset(X.count, 0, sizeof X.count);
  X.other_instances_advance = yield_to_other_instances;
  for (int u = 0; u < NUM_INSTANCES; ++u) {
    Instance &inst = MX.instance[u];
    inst.stack.resize(INSTANCE_STACK_BYTES);
    inst.done = u != UNIT_AIC && !vector_cores;
    inst.error = nullptr;
    inst.pipes.schedule = P.schedule;
    inst.pipes.reset();
    if (u != UNIT_AIC) {
      inst.ub.resize((size_t)(MX.ub_alloc + 7) / 8 + 1);
      for (auto &word : inst.ub) word = random_u64();  // UB nothing wrote reads as garbage
    }
    getcontext(&inst.context);
    inst.context.uc_stack.ss_sp = inst.stack.data();
    inst.context.uc_stack.ss_size = inst.stack.size();
    inst.context.uc_link = nullptr;
    makecontext(&inst.context, instance_main, 0);
  }
  int order[NUM_INSTANCES] = {UNIT_AIC, UNIT_AIV0, UNIT_AIV1};
  for (;;) {
    if (P.schedule != SCHEDULE_SEQ)
      for (int i = NUM_INSTANCES - 1; i > 0; --i) std::swap(order[i], order[random_u64() % (i + 1)]);
    bool advanced = false, running = false;
    for (int u : order) {
      Instance &inst = MX.instance[u];
      if (inst.done) continue;
      running = true;
      const uint64_t before = X.progress;
      enter(u);
      swapcontext(&MX.scheduler, &inst.context);
      leave(u);
      if (inst.error) std::rethrow_exception(inst.error);
      advanced |= inst.done || X.progress != before;
    }
    if (!running) break;
    if (!advanced) fail("deadlock between the cores of the AI core:%s", blocked_instances().c_str());
  }
  for (int u = 0; u < NUM_INSTANCES; ++u)
    for (int id = 0; id < NUM_INTRA_IDS; ++id)
      if (X.count[u][id])
        fail("cross-core counter %d of %s is %d at the end of the kernel (an asc_sync_intra_arrive nobody waited for)",
             id, unit_name(u), X.count[u][id]);
  X.other_instances_advance = nullptr;
  X.unit = 0;
}

}  // namespace ascend_sim
