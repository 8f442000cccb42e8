#include "trainer/observe/straggler.h"

#include <algorithm>
#include <cstdio>

#include "common/errors.h"

namespace partrain {

StragglerCount::StragglerCount(int world_size)
    : world_size_(world_size),
      last_(static_cast<std::size_t>(world_size), 0),
      cost_(static_cast<std::size_t>(world_size), 0.0) {}

void StragglerCount::add_step(std::span<const double> arrivals) {
  PARTRAIN_CHECK_EQ(arrivals.size(), static_cast<std::size_t>(world_size_), Error,
                    "straggler count: one arrival per rank");
  if (world_size_ < 2) return;
  std::size_t last = 0;
  for (std::size_t r = 1; r < arrivals.size(); ++r) {
    if (arrivals[r] > arrivals[last]) last = r;
  }
  double before_last = 0;
  bool have = false;
  for (std::size_t r = 0; r < arrivals.size(); ++r) {
    if (r == last) continue;
    if (!have || arrivals[r] > before_last) before_last = arrivals[r];
    have = true;
  }
  const double first = *std::min_element(arrivals.begin(), arrivals.end());
  ++steps_;
  ++last_[last];
  cost_[last] += arrivals[last] - before_last;
  if (kept_.size() < kStragglerStepsKept) {
    kept_.push_back(StepRecord{static_cast<int>(last), arrivals[last] - before_last,
                               previous_first_ ? first - *previous_first_ : -1.0});
  }
  previous_first_ = first;
}

std::optional<Straggler> StragglerCount::verdict(double training_seconds) const {
  if (steps_ == 0 || world_size_ < 2) return std::nullopt;
  int worst = 0;
  for (int r = 1; r < world_size_; ++r) {
    if (cost_[static_cast<std::size_t>(r)] > cost_[static_cast<std::size_t>(worst)]) worst = r;
  }
  double next = 0;  // the largest cost of any other rank
  for (int r = 0; r < world_size_; ++r) {
    if (r != worst) next = std::max(next, cost_[static_cast<std::size_t>(r)]);
  }
  const auto w = static_cast<std::size_t>(worst);
  if (cost_[w] - next < kStragglerCost * training_seconds) return std::nullopt;

  Straggler s{worst, last_[w], steps_, cost_[w]};
  std::vector<double> intervals;
  for (const StepRecord& k : kept_) {
    if (k.interval >= 0) intervals.push_back(k.interval);
  }
  if (!intervals.empty()) {
    auto mid = intervals.begin() + static_cast<std::ptrdiff_t>(intervals.size() / 2);
    std::nth_element(intervals.begin(), mid, intervals.end());
    s.median_step_seconds = *mid;
  }
  double kept_cost = 0, away_cost = 0;
  for (const StepRecord& k : kept_) {
    if (k.last != worst) continue;
    kept_cost += k.lateness;
    if (s.median_step_seconds > 0 && k.lateness > s.median_step_seconds) {
      away_cost += k.lateness;
      ++s.steps_away;
    }
  }
  s.kind = kept_cost > 0 && away_cost >= 0.5 * kept_cost ? "away" : "slow";
  return s;
}

std::optional<std::string> straggler_change(const std::optional<Straggler>& before,
                                            const std::optional<Straggler>& now) {
  if (before.has_value() == now.has_value() && (!now || before->rank == now->rank)) {
    return std::nullopt;
  }
  if (!now) {
    return "straggler: none this epoch (rank " + std::to_string(before->rank) +
           " no longer holds the others up)";
  }
  char line[240];
  if (now->kind == "away") {
    std::snprintf(line, sizeof line,
                  "straggler: rank %d was away for whole steps this epoch (%lld steps late by "
                  "more than a step); the others waited %.2f s for it",
                  now->rank, static_cast<long long>(now->steps_away), now->seconds_cost);
  } else {
    std::snprintf(line, sizeof line,
                  "straggler: rank %d was last at %lld of %lld steps this epoch; the others "
                  "waited %.2f s for it",
                  now->rank, static_cast<long long>(now->steps_last),
                  static_cast<long long>(now->steps), now->seconds_cost);
  }
  return std::string(line);
}

}  // namespace partrain
