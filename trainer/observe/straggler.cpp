#include "trainer/observe/straggler.h"

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
  ++steps_;
  ++last_[last];
  cost_[last] += arrivals[last] - before_last;
}

std::optional<Straggler> StragglerCount::verdict(double training_seconds) const {
  if (steps_ == 0 || world_size_ < 2) return std::nullopt;
  int worst = 0;
  for (int r = 1; r < world_size_; ++r) {
    if (last_[static_cast<std::size_t>(r)] > last_[static_cast<std::size_t>(worst)]) worst = r;
  }
  const auto w = static_cast<std::size_t>(worst);
  const bool often = static_cast<double>(last_[w]) > kStragglerShare * static_cast<double>(steps_);
  const bool costly = cost_[w] >= kStragglerCost * training_seconds;
  if (!often || !costly) return std::nullopt;
  return Straggler{worst, last_[w], steps_, cost_[w]};
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
  char line[200];
  std::snprintf(line, sizeof line,
                "straggler: rank %d was last at %lld of %lld steps this epoch; the others waited "
                "%.2f s for it",
                now->rank, static_cast<long long>(now->steps_last),
                static_cast<long long>(now->steps), now->seconds_cost);
  return std::string(line);
}

}  // namespace partrain
