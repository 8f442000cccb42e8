// defines: BalanceControl — global-batch mode's split of each micro-step over the ranks, kept
// for the epoch loop: the config's split (data.balance even or weights) or a resumed one, and
// with data.balance auto the measuring and the moves (trainer/data/balance.h): each rank's busy
// seconds per sample go into the step exchange, and from every rank's figures each rank derives
// the same new split, which reaches the loader (its slices) and the strategy (the gradient's
// scale) before the same next step everywhere.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/stopwatch.h"
#include "trainer/config/config.h"
#include "trainer/data/balance.h"
#include "trainer/loop/step_exchange.h"
#include "trainer/loop/worker.h"
#include "trainer/report/report_writer.h"

namespace partrain {

namespace data {
class Loader;
}
class PhaseTimes;
class StallMeter;
class Strategy;

class BalanceControl {
 public:
  // Inactive (shares() empty) in per-rank mode. `times`: the phase timers whose work spans
  // auto measures.
  BalanceControl(const Config& config, const WorkerEnv& env, data::Loader& train,
                 Strategy& strategy, PhaseTimes& times);
  ~BalanceControl();

  // Starts from the config's split, or `resumed` when it is not empty and differs from it (a
  // checkpoint's auto split, Checkpointer::resume).
  void start(const std::vector<std::int64_t>& resumed);

  // Every rank's samples per micro-step now, in rank order; empty in per-rank mode.
  const std::vector<std::int64_t>& shares() const { return shares_; }

  // auto: where a step's measurement starts (an epoch's first starts after its evaluation),
  // and this rank's samples trained since.
  void start_measuring();
  void count_samples(std::int64_t samples) { step_samples_ += samples; }
  // auto, after an optimizer step: this rank's figures into `slots` before the exchange; after
  // it, the split moved (or a move taken back) when AutoBalance says so, the same on every rank.
  void fill_slots(StepSlots& slots);
  void after_exchange(std::int64_t step, StepSlots& slots);

  // report.json's "balance": the split at the end and auto's changes; nothing in per-rank mode.
  std::optional<BalanceRecord> record() const;

 private:
  // The split the next micro-steps take: the loader's slices and the gradient's scale.
  void use_shares(const std::vector<std::int64_t>& shares);
  // This rank since the last call: the wall seconds of its own work (data wait, forward,
  // backward, optimizer) and of every stall outside it, per sample (0 without samples), the
  // fraction of the wall time it was not stalled, and that wall time.
  struct RankSpeed {
    double seconds_per_sample = 0;
    double running = 1;
    double step_seconds = 0;
  };
  RankSpeed measure_speed();

  const Config& config_;
  WorkerEnv env_;
  data::Loader& train_;
  Strategy& strategy_;
  PhaseTimes& times_;
  std::vector<std::int64_t> shares_;
  std::optional<data::AutoBalance> auto_balance_;  // data.balance auto with several ranks
  std::vector<data::BalanceChange> changes_;
  std::unique_ptr<StallMeter> stalls_;  // auto: when this process was held off its CPUs
  Clock::time_point measured_from_;
  std::int64_t step_samples_ = 0;
};

}  // namespace partrain
