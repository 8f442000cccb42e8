// defines: StragglerCount — which rank arrives last at each step's gradient allreduce and what
// that costs the others; and the rule that names one rank the run's straggler. LibTorch-free.
//
// In a synchronous allreduce everyone waits for the last rank to arrive. For each step, the
// last rank's cost is how much later it arrived than the rank before it: had it come with
// that one, the step would have ended that much sooner. A rank is the straggler when it was
// last in more than kStragglerShare of the steps and its cost adds up to at least
// kStragglerCost of the training time; otherwise the lateness is spread (or too small to
// matter) and the run has no straggler.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainer/report/report_format.h"

namespace partrain {

inline constexpr double kStragglerShare = 0.6;
inline constexpr double kStragglerCost = 0.02;

class StragglerCount {
 public:
  explicit StragglerCount(int world_size);

  // One step: each rank's arrival (index = rank), in seconds on one clock.
  void add_step(std::span<const double> arrivals);

  std::int64_t steps() const { return steps_; }
  std::int64_t steps_last(int rank) const { return last_[static_cast<std::size_t>(rank)]; }
  double seconds_cost(int rank) const { return cost_[static_cast<std::size_t>(rank)]; }

  // The rank that was last most often, if the rule above names it. training_seconds: the
  // wall time the cost is held against.
  std::optional<Straggler> verdict(double training_seconds) const;

 private:
  int world_size_;
  std::int64_t steps_ = 0;
  std::vector<std::int64_t> last_;
  std::vector<double> cost_;
};

// What a person watching the run is told at the end of an epoch: a line when the epoch's
// straggler is another rank than the previous epoch's (or there is one where there was none,
// or none where there was one); nothing while it stays the same, so an even run prints none.
std::optional<std::string> straggler_change(const std::optional<Straggler>& before,
                                            const std::optional<Straggler>& now);

}  // namespace partrain
