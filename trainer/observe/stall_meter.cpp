#include "trainer/observe/stall_meter.h"

#include <algorithm>

namespace partrain {

StallMeter::StallMeter(StallMeterOptions options) : options_(options) {
  thread_ = std::thread([this] { run(); });
}

StallMeter::~StallMeter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StallMeter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  // Bounded by the destructor: each pass waits at most one tick, and stop_ ends it.
  while (!stop_) {
    const Clock::time_point due = Clock::now() + options_.tick;
    if (wake_.wait_until(lock, due, [this] { return stop_; })) break;
    const Clock::time_point now = Clock::now();
    if (now - due > options_.slack) {
      stalls_.push_back({due - options_.tick / 2, now});
      if (stalls_.size() > options_.keep) stalls_.pop_front();
    }
  }
}

void StallMeter::record(TimeSpan stall) {
  std::lock_guard<std::mutex> lock(mu_);
  stalls_.push_back(stall);
  if (stalls_.size() > options_.keep) stalls_.pop_front();
}

Clock::duration StallMeter::stalled_within(const std::vector<TimeSpan>& spans) const {
  Clock::duration covered{0};
  std::lock_guard<std::mutex> lock(mu_);
  for (const TimeSpan& span : spans) {
    // Stalls are recorded in order of their ends; those that ended before the span cannot
    // touch it, and few do (the caller asks about recent spans).
    for (auto it = stalls_.rbegin(); it != stalls_.rend() && it->end > span.start; ++it) {
      const Clock::time_point from = std::max(span.start, it->start);
      const Clock::time_point to = std::min(span.end, it->end);
      if (to > from) covered += to - from;
    }
  }
  return covered;
}

Clock::duration stalls_within_work(const std::vector<TimeSpan>& stalls, TimeSpan span,
                                   Clock::duration net_work) {
  Clock::duration slices{0};
  for (const TimeSpan& stall : stalls) {
    if (stall.end - stall.start > net_work) continue;
    const Clock::time_point from = std::max(stall.start, span.start);
    const Clock::time_point to = std::min(stall.end, span.end);
    if (to > from) slices += to - from;
  }
  return slices;
}

std::vector<TimeSpan> StallMeter::stalls_overlapping(TimeSpan span) const {
  std::vector<TimeSpan> found;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = stalls_.rbegin(); it != stalls_.rend() && it->end > span.start; ++it) {
    if (it->start < span.end) found.push_back(*it);
  }
  std::reverse(found.begin(), found.end());
  return found;
}

}  // namespace partrain
