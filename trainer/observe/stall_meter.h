// defines: StallMeter — when this process was held off its CPUs from outside: stopped (SIGSTOP,
// a job scheduler's suspend, a debugger), or a paused virtual machine. LibTorch-free.
//
// Nothing inside a process sees such a stop as anything but a slow piece of work: a clock read
// before and after it differs by the stop. A rank's compute timers then blame the stop on
// whatever it was doing, and a rank stopped while it waits at the gradient allreduce looks as
// fast as ever although every other rank waits with it. So a thread of its own sleeps a tick at
// a time and records each wake-up that comes late by more than a slack as a stall: the process
// could not run until then. The stall began somewhere in the sleep before; it is recorded from
// the middle of that sleep, so each one's length is right to within half a tick either way.
//
// The tick trades resolution for cost: each wake-up takes a CPU from the training for a
// moment. At 2 ms, two ranks on two busy cores trained measurably slower (up to 10 %,
// BENCHMARKS.md); at 10 ms no slower than without the meter, and a stop of 50 ms is still
// measured to 5 ms.
//
// The slack keeps ordinary wake-up latency out: on a busy machine a sleeping thread waits a
// few milliseconds for a CPU now and then. A process that shares its CPU in slices shorter
// than the slack (a busy neighbour on the same core) does not stall here; its work simply
// takes longer, which its timers see.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "common/stopwatch.h"

namespace partrain {

struct StallMeterOptions {
  std::chrono::microseconds tick{10000};  // the sleep between two looks at the clock
  std::chrono::microseconds slack{5000};  // lateness under this is not a stall
  std::size_t keep = 4096;                // the newest stalls kept; older ones are dropped
};

// Of `stalls` (whole, as stalls_overlapping() gives them), the time within `span` of those no
// longer than `net_work`: slices of a rank's work, which a smaller share of the samples
// shortens. A longer stall is an absence for whole steps, which no share shortens, and is
// left out (EpochLoop::measure_speed, data.balance auto).
Clock::duration stalls_within_work(const std::vector<TimeSpan>& stalls, TimeSpan span,
                                   Clock::duration net_work);

class StallMeter {
 public:
  // Starts the thread (throws std::system_error when it cannot).
  explicit StallMeter(StallMeterOptions options = {});
  // Stops the thread: it sees the request within one tick.
  ~StallMeter();
  StallMeter(const StallMeter&) = delete;
  StallMeter& operator=(const StallMeter&) = delete;

  // How much of `spans` (disjoint) the recorded stalls cover. A stall that ended moments ago
  // may not be recorded yet (the thread records it when it runs again): ask about spans that
  // ended at least a few ticks back for their whole figure.
  Clock::duration stalled_within(const std::vector<TimeSpan>& spans) const;
  // The recorded stalls that overlap `span`, whole (not cut to it), oldest first.
  std::vector<TimeSpan> stalls_overlapping(TimeSpan span) const;

  // Test seam: records a stall as the thread would.
  void record(TimeSpan stall);

 private:
  void run();

  const StallMeterOptions options_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::deque<TimeSpan> stalls_;  // oldest first
  std::thread thread_;
};

}  // namespace partrain
