#include "trainer/observe/phase_times.h"

#include <algorithm>
#include <chrono>

namespace partrain {

PhaseTimes::PhaseTimes(Clock::time_point start) { start_.at = start; }

Clock::time_point PhaseTimes::mark(Phase phase, Clock::time_point since) {
  const Clock::time_point now = Clock::now();
  totals_[static_cast<std::size_t>(phase)] += now - since;
  if (tracing_) keep(TimedSpan{phase, -1, step_, 0, since, now});
  if (keep_work_ && (phase == Phase::kDataWait || phase == Phase::kForward ||
                     phase == Phase::kBackward || phase == Phase::kOptimizer)) {
    if (!work_spans_.empty() && work_spans_.back().end == since) {
      work_spans_.back().end = now;
    } else {
      work_spans_.push_back({since, now});
    }
  }
  return now;
}

std::vector<TimeSpan> PhaseTimes::take_work_spans() {
  std::vector<TimeSpan> spans;
  spans.swap(work_spans_);
  return spans;
}

void PhaseTimes::trace_steps(std::int64_t first, std::int64_t last, std::size_t max_spans) {
  first_ = first;
  last_ = last;
  max_spans_ = max_spans;
  spans_.reserve(std::min<std::size_t>(max_spans, 4096));
}

void PhaseTimes::add_collectives(std::int64_t step, const std::vector<BucketTiming>& buckets) {
  if (!tracing_) return;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    keep(TimedSpan{Phase::kCommExposed, static_cast<int>(b), step, buckets[b].bytes,
                   buckets[b].start, buckets[b].end});
  }
}

void PhaseTimes::keep(const TimedSpan& span) {
  if (spans_.size() < max_spans_) {
    spans_.push_back(span);
  } else {
    ++dropped_;
  }
}

PhaseTimes::Snapshot PhaseTimes::snapshot() const {
  Snapshot s;
  s.at = Clock::now();
  s.totals = totals_;
  return s;
}

Breakdown breakdown_between(const PhaseTimes::Snapshot& from, const PhaseTimes::Snapshot& to) {
  using Seconds = std::chrono::duration<double>;
  std::array<Clock::duration, kPhaseCount> part{};
  Clock::duration measured{0};
  for (std::size_t p = 0; p < kPhaseCount; ++p) {
    part[p] = to.totals[p] - from.totals[p];
    measured += part[p];
  }
  auto seconds = [&](Phase p) { return Seconds(part[static_cast<std::size_t>(p)]).count(); };
  Breakdown b;
  b.data_wait = seconds(Phase::kDataWait);
  b.forward = seconds(Phase::kForward);
  b.backward = seconds(Phase::kBackward);
  b.comm_exposed = seconds(Phase::kCommExposed);
  b.optimizer = seconds(Phase::kOptimizer);
  b.evaluation = seconds(Phase::kEvaluation);
  b.checkpoint = seconds(Phase::kCheckpoint);
  b.other = Seconds((to.at - from.at) - measured).count();
  return b;
}

const char* span_name(Phase phase) {
  switch (phase) {
    case Phase::kDataWait:
      return "data wait";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kCommExposed:
      return "wait for gradients";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kEvaluation:
      return "evaluation";
    case Phase::kCheckpoint:
      return "checkpoint";
  }
  return "?";
}

}  // namespace partrain
