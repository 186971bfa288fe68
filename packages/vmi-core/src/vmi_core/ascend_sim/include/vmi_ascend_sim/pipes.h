// vmi ascend-sim: the pipes of one AI Vector core and the events between them.
//
// Each pipe (MTE2: GM->UB DMA, V: vector regions, MTE3: UB->GM DMA, S: the scalar
// unit, ...) is an in-order queue. `asc_sync_notify(src, dst, ev)` (set_flag) runs on
// the source pipe and sets the flag (src, dst, ev); `asc_sync_wait(src, dst, ev)`
// (wait_flag) blocks the destination pipe until the flag is set, then clears it
// (asc-devkit C API docs, asc_sync_notify / asc_sync_wait, arch 3510; AscendC
// SetFlag/WaitFlag). A flag holds one pending set: setting a set flag is an error
// here (ASSUMPTION: the hardware flag is one bit, not a counter).
//
// Schedules: `seq` runs every operation when the scalar unit issues it (a wait on a
// clear flag is then an error: nothing could ever set it); the queued schedules run
// nothing at issue and let the pipes advance in a chosen order (random, consumers
// first, producers first), so a missing wait lets a consumer overtake its producer
// and shows up as wrong data. A state where no pipe can advance is a deadlock; a flag
// still set when the core ends is an error.
//
// In a mixed (Cube + vector) kernel each AI core runs three instances of the kernel (the
// AIC and two AIVs, `mix.h`), each with its own pipes and flags; they meet only through the
// cross-core counters of `asc_sync_intra_arrive` / `asc_sync_intra_wait` (ARRIVE and AWAIT
// operations here). Where a pipe or the scalar unit of one instance waits on a counter that
// only another instance can raise, the instance hands over (`other_instances_advance`),
// and a state where no instance can advance is a deadlock.
#pragma once

#include <deque>
#include <functional>

#include "core.h"

enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX };
enum event_t { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };

namespace ascend_sim {

constexpr int NUM_PIPES = 8;
constexpr int NUM_EVENTS = 8;

enum Schedule { SCHEDULE_SEQ = 0, SCHEDULE_RANDOM = 1, SCHEDULE_CONSUMERS_FIRST = 2, SCHEDULE_PRODUCERS_FIRST = 3 };

inline const char *pipe_name(int p) {
  static const char *names[NUM_PIPES] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "ALL", "FIX"};
  return p >= 0 && p < NUM_PIPES ? names[p] : "?";
}

// Cross-core counters of one AI core: [instance][sync id] (mix.h).
constexpr int NUM_INSTANCES = 3;
constexpr int NUM_INTRA_IDS = 32;
constexpr int MAX_INTRA_COUNT = 15;  // asc-devkit asc_sync_block_wait: "at most 15 times" per counter

struct Intra {
  int count[NUM_INSTANCES][NUM_INTRA_IDS];
  int unit = 0;  // the running instance
  uint64_t progress = 0;  // operations executed, over all instances
  // Runs the other instances until they block or end; false when none of them advanced.
  bool (*other_instances_advance)() = nullptr;
};

inline Intra X;

struct Op {
  // ARRIVE raises counter `event` of instance `dst`; AWAIT takes one from the running
  // instance's counter `event`, waiting while it is 0. UNLOCK releases mutex `event`; LOCK
  // waits until the `src` UNLOCKs of mutex `event` issued before it have run.
  enum Kind { WORK, NOTIFY, WAIT, ARRIVE, AWAIT, LOCK, UNLOCK } kind;
  int src, dst, event;
  std::function<void()> work;
  std::string what;
};

constexpr int NUM_MUTEXES = 32;  // asc_lock / asc_unlock mutex_id in [0, 31]

struct Pipes {
  int schedule = SCHEDULE_SEQ;
  bool flag[NUM_PIPES][NUM_PIPES][NUM_EVENTS];
  long unlocks_issued[NUM_MUTEXES], unlocks_done[NUM_MUTEXES];
  std::deque<Op> queue[NUM_PIPES];
  long issued = 0;

  void reset() {
    memset(flag, 0, sizeof flag);
    memset(unlocks_issued, 0, sizeof unlocks_issued);
    memset(unlocks_done, 0, sizeof unlocks_done);
    for (auto &q : queue) q.clear();
    issued = 0;
  }
};

inline Pipes P;

inline std::string flag_name(int src, int dst, int event) {
  char text[48];
  snprintf(text, sizeof text, "%s->%s event %d", pipe_name(src), pipe_name(dst), event);
  return text;
}

inline void execute(Op &op) {
  ++X.progress;
  switch (op.kind) {
    case Op::WORK:
      op.work();
      break;
    case Op::NOTIFY:
      if (P.flag[op.src][op.dst][op.event])
        fail("set_flag %s while it is still set (no wait in between)", flag_name(op.src, op.dst, op.event).c_str());
      P.flag[op.src][op.dst][op.event] = true;
      break;
    case Op::WAIT:
      P.flag[op.src][op.dst][op.event] = false;
      break;
    case Op::ARRIVE:
      if (++X.count[op.dst][op.event] > MAX_INTRA_COUNT)
        fail("asc_sync_intra_arrive: cross-core counter %d of %s raised past %d (arrives nobody waits for)", op.event,
             op.dst == 0 ? "the AIC" : op.dst == 1 ? "AIV0" : "AIV1", MAX_INTRA_COUNT);
      break;
    case Op::AWAIT:
      --X.count[X.unit][op.event];
      break;
    case Op::LOCK:
      break;
    case Op::UNLOCK:
      ++P.unlocks_done[op.event];
      break;
  }
}

inline bool ready(int pipe) {
  if (P.queue[pipe].empty()) return false;
  const Op &op = P.queue[pipe].front();
  if (op.kind == Op::AWAIT) return X.count[X.unit][op.event] > 0;
  if (op.kind == Op::LOCK) return P.unlocks_done[op.event] >= op.src;
  return op.kind != Op::WAIT || P.flag[op.src][op.dst][op.event];
}

inline std::string blocked_pipes() {
  std::string text;
  for (int p = 0; p < NUM_PIPES; ++p)
    if (!P.queue[p].empty()) text += std::string(" pipe ") + pipe_name(p) + " waits at '" + P.queue[p].front().what + "';";
  return text;
}

// Advance the pipes until `done()` holds; false when nothing can advance first.
inline bool advance(const std::function<bool()> &done) {
  static const int consumers_first[NUM_PIPES] = {PIPE_V, PIPE_MTE3, PIPE_FIX, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_S, PIPE_ALL};
  static const int producers_first[NUM_PIPES] = {PIPE_MTE2, PIPE_MTE1, PIPE_V, PIPE_M, PIPE_FIX, PIPE_MTE3, PIPE_S, PIPE_ALL};
  while (!done()) {
    int candidates[NUM_PIPES], n = 0;
    for (int p = 0; p < NUM_PIPES; ++p)
      if (ready(p)) candidates[n++] = p;
    if (n == 0) return false;
    int pick = candidates[0];
    if (P.schedule == SCHEDULE_RANDOM) {
      pick = candidates[random_u64() % n];
    } else {
      const int *order = P.schedule == SCHEDULE_PRODUCERS_FIRST ? producers_first : consumers_first;
      for (int i = 0; i < NUM_PIPES; ++i)
        if (ready(order[i])) {
          pick = order[i];
          break;
        }
    }
    Op op = std::move(P.queue[pick].front());
    P.queue[pick].pop_front();
    execute(op);
  }
  return true;
}

// `advance`, letting the other instances of the AI core run while this one cannot.
inline bool advance_with_others(const std::function<bool()> &done) {
  while (!advance(done))
    if (!X.other_instances_advance || !X.other_instances_advance()) return false;
  return true;
}

inline bool all_idle() {
  for (auto &q : P.queue)
    if (!q.empty()) return false;
  return true;
}

inline void drain(const char *where) {
  if (!advance_with_others(all_idle)) fail("deadlock at %s:%s", where, blocked_pipes().c_str());
}

inline void issue(int pipe, Op op) {
  ++P.issued;
  if (P.schedule == SCHEDULE_SEQ) {
    if (op.kind == Op::WAIT && !P.flag[op.src][op.dst][op.event])
      fail("wait_flag %s can never be satisfied: the flag is clear and every earlier operation has completed",
           flag_name(op.src, op.dst, op.event).c_str());
    if (op.kind == Op::LOCK && P.unlocks_done[op.event] < op.src)
      fail("asc_lock of mutex %d can never be satisfied: an earlier asc_unlock has not run", op.event);
    while (op.kind == Op::AWAIT && X.count[X.unit][op.event] == 0)
      if (!X.other_instances_advance || !X.other_instances_advance())
        fail("deadlock: asc_sync_intra_wait on counter %d, which no instance of the AI core can raise", op.event);
    execute(op);
    return;
  }
  if (pipe == PIPE_S) {  // the scalar unit itself blocks until its wait is satisfied
    P.queue[PIPE_S].push_back(std::move(op));
    if (!advance_with_others([] { return P.queue[PIPE_S].empty(); }))
      fail("deadlock: the scalar unit waits forever:%s", blocked_pipes().c_str());
    return;
  }
  P.queue[pipe].push_back(std::move(op));
}

// At the end of a core: every pipe has finished and no flag is left set.
inline void finish_core() {
  if (P.schedule != SCHEDULE_SEQ) drain("the end of the kernel");
  for (int s = 0; s < NUM_PIPES; ++s)
    for (int d = 0; d < NUM_PIPES; ++d)
      for (int e = 0; e < NUM_EVENTS; ++e)
        if (P.flag[s][d][e]) fail("event %s is still set at the end of the kernel (a set_flag nobody waited for)",
                                  flag_name(s, d, e).c_str());
}

}  // namespace ascend_sim
