// defines: Phase, PhaseTimes, BucketTiming and TimedSpan — the one set of timers of a rank's
// training: the loop marks the end of each phase, PhaseTimes adds the interval to the phase's
// total (the breakdown) and, inside the traced steps, keeps it as a span (the trace).
// LibTorch-free.
//
// A mark costs one steady_clock read and no device synchronisation. On CUDA the host runs
// ahead of the device, so a phase's time is the host's: kernels queued in forward and
// backward are mostly paid for where the host next waits for the device — in comm_exposed
// (finish_backward waits until each bucket's gradients are written) or in `other` (the
// progress line reads the loss).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/stopwatch.h"
#include "trainer/report/report_format.h"

namespace partrain {

// The measured parts of Breakdown (its `other` is what is left).
enum class Phase : std::uint8_t {
  kDataWait,
  kForward,
  kBackward,
  kCommExposed,
  kOptimizer,
  kEvaluation,
  kCheckpoint
};
inline constexpr std::size_t kPhaseCount = 7;

// One gradient bucket's collective in one sync step, as the Reducer's communication thread
// saw it. start is when the bucket was handed to the communicator: a rank's arrival.
struct BucketTiming {
  std::size_t bytes = 0;
  Clock::time_point start;
  Clock::time_point end;
};

// A phase, or (collective >= 0) bucket `collective`'s allreduce, of optimizer step `step`.
struct TimedSpan {
  Phase phase = Phase::kDataWait;
  int collective = -1;  // the bucket index for an allreduce span
  std::int64_t step = 0;
  std::size_t bytes = 0;
  Clock::time_point start;
  Clock::time_point end;
};

class PhaseTimes {
 public:
  // The totals so far and when they were taken; two of them give the breakdown between.
  struct Snapshot {
    Clock::time_point at;
    std::array<Clock::duration, kPhaseCount> totals{};
  };

  explicit PhaseTimes(Clock::time_point start = Clock::now());

  // Adds [since, now) to `phase` and returns now, so that the next phase starts where this one
  // ended with a single clock read between them.
  Clock::time_point mark(Phase phase, Clock::time_point since);

  // Spans are kept for optimizer steps first..last (inclusive), at most `max_spans` of them
  // (the rest are counted in dropped_spans()). Off until called.
  void trace_steps(std::int64_t first, std::int64_t last, std::size_t max_spans);
  // The optimizer step the marks from here on belong to.
  void set_step(std::int64_t step) {
    step_ = step;
    tracing_ = step >= first_ && step <= last_;
  }
  bool tracing() const { return tracing_; }
  // The buckets of a sync step, as spans on the communication thread (when tracing).
  void add_collectives(std::int64_t step, const std::vector<BucketTiming>& buckets);

  // From here on, keeps the intervals of a step's own work: data wait, forward, backward and
  // optimizer, not the wait at the gradient allreduce (data.balance auto measures the stalls
  // within them, trainer/observe/stall_meter.h); take_work_spans() empties them.
  void keep_work_spans() { keep_work_ = true; }
  std::vector<TimeSpan> take_work_spans();

  Snapshot snapshot() const;
  const Snapshot& start() const { return start_; }
  const std::vector<TimedSpan>& spans() const { return spans_; }
  std::size_t dropped_spans() const { return dropped_; }

 private:
  void keep(const TimedSpan& span);

  Snapshot start_;
  std::array<Clock::duration, kPhaseCount> totals_{};
  std::int64_t step_ = 0;
  std::int64_t first_ = 0;
  std::int64_t last_ = -1;
  bool tracing_ = false;
  bool keep_work_ = false;
  std::vector<TimeSpan> work_spans_;  // adjoining ones merged
  std::size_t max_spans_ = 0;
  std::size_t dropped_ = 0;
  std::vector<TimedSpan> spans_;
};

// What happened between two snapshots of the same PhaseTimes: each phase's seconds, and
// `other` = the wall time between them minus the phases, computed in whole clock ticks so
// that the parts add up to the wall time exactly.
Breakdown breakdown_between(const PhaseTimes::Snapshot& from, const PhaseTimes::Snapshot& to);

// The span's name in the trace ("forward", "allreduce") and the thread it is drawn on.
const char* span_name(Phase phase);

}  // namespace partrain
