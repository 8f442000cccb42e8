// defines: StragglerCount — which rank arrives last at each step's gradient allreduce and what
// that costs the others; and the rule that names one rank the run's straggler. LibTorch-free.
//
// In a synchronous allreduce everyone waits for the last rank to arrive. For each step, the
// last rank's cost is how much later it arrived than the rank before it: had it come with
// that one, the step would have ended that much sooner. The straggler is the rank that cost
// the others the most time, when its cost exceeds every other rank's by at least
// kStragglerCost of the training time. How often it was last does not decide: a rank that is
// away for a few whole steps (its device lent to another job in slices) is last in few steps
// but holds the others up for long, while ranks that take turns at being last by a little
// cost about the same each and cancel out.
//
// Its kind says how it is slow: `away` when at least half of its cost came from steps where it
// arrived more than a whole step late (later than the median interval between steps), which a
// rank that is merely slower cannot do; `slow` (slower at every step) otherwise.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainer/report/report_format.h"

namespace partrain {

inline constexpr double kStragglerCost = 0.02;
// Steps kept for the kind (each step's last rank, its lateness and the interval since the step
// before); the counts go on past it, the kind is judged on the steps kept.
inline constexpr std::size_t kStragglerStepsKept = 1 << 20;

class StragglerCount {
 public:
  explicit StragglerCount(int world_size);

  // One step: each rank's arrival (index = rank), in seconds on one clock.
  void add_step(std::span<const double> arrivals);

  std::int64_t steps() const { return steps_; }
  std::int64_t steps_last(int rank) const { return last_[static_cast<std::size_t>(rank)]; }
  double seconds_cost(int rank) const { return cost_[static_cast<std::size_t>(rank)]; }

  // The rank that cost the others the most, if the rule above names it, with its kind.
  // training_seconds: the wall time the cost is held against.
  std::optional<Straggler> verdict(double training_seconds) const;

 private:
  int world_size_;
  std::int64_t steps_ = 0;
  std::vector<std::int64_t> last_;
  std::vector<double> cost_;
  struct StepRecord {
    int last = 0;
    double lateness = 0;  // its arrival minus the one before it
    double interval = 0;  // since the previous step's first arrival; < 0 for the first step
  };
  std::vector<StepRecord> kept_;
  std::optional<double> previous_first_;
};

// What a person watching the run is told at the end of an epoch: a line when the epoch's
// straggler is another rank than the previous epoch's (or there is one where there was none,
// or none where there was one); nothing while it stays the same, so an even run prints none.
std::optional<std::string> straggler_change(const std::optional<Straggler>& before,
                                            const std::optional<Straggler>& now);

}  // namespace partrain
