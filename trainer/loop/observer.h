// defines: RunObserver — one rank's observation of its run (trainer/observe): the phase timers
// the loop and the step mark, each sync step's arrival at the gradient allreduce, this rank's
// clock offset to rank 0; and what crosses the ranks: at each epoch's end one sum over the
// ranks carries every rank's breakdown and arrivals of the epoch (no collective per step), and
// at the end of the run the traced spans go to rank 0 through the store.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/loop/worker.h"
#include "trainer/observe/clock_sync.h"
#include "trainer/observe/phase_times.h"
#include "trainer/observe/straggler.h"
#include "trainer/observe/test_injection.h"
#include "trainer/report/report_format.h"

namespace partrain {

namespace comm {
class Communicator;
class Store;
}  // namespace comm

// Spans rank 0 holds for the whole trace at most; each rank keeps its share of them.
inline constexpr std::size_t kMaxTraceSpans = 2'000'000;

class RunObserver {
 public:
  RunObserver(const Config& config, const WorkerEnv& env);

  // ddp with several ranks (store not null): estimates this rank's clock offset to rank 0.
  // Every rank calls it, at the same point of start-up.
  void sync_clocks(comm::Store* store);

  // This rank's start-up phases (worker.cpp fills them; rank 0's go into report.json).
  StartupRecord& startup() { return startup_; }
  const StartupRecord& startup() const { return startup_; }

  // The training starts: the breakdown's zero, and the trace window armed.
  void start();
  PhaseTimes& times() { return times_; }

  // Test-only: the step delay of PARTRAIN_TEST_STEP_DELAY (test_injection.h), if any.
  void inject_step_delay() const;
  // Test-only: PARTRAIN_TEST_SAMPLE_DELAY's seconds per sample for this rank, 0 unset.
  double sample_delay() const { return faults_.sample_delay_s; }

  // After a training batch of optimizer step `step`; sync: it ended with the gradient
  // allreduce, whose bucket timings these are (empty without ddp).
  void after_batch(bool sync, std::int64_t step, const std::vector<BucketTiming>& buckets);

  // Every rank, at the end of an epoch: each rank's breakdown since the previous call (or
  // start()), in rank order; the epoch's arrivals go into the straggler count.
  std::vector<Breakdown> end_epoch(comm::Communicator* comm, const c10::Device& device);

  // The training ends: the run's breakdown stops here.
  void finish();
  Breakdown breakdown() const { return breakdown_between(times_.start(), end_); }
  // The run's straggler, held against this rank's training time.
  std::optional<Straggler> straggler() const;
  // After end_epoch: a line for the person watching when the epoch's straggler differs from
  // the previous epoch's (straggler_change); every rank computes the same.
  const std::optional<std::string>& straggler_news() const { return straggler_news_; }

  // Every rank, when observe.trace is on: the spans go to rank 0, which writes
  // OUTPUT/trace.json. backend: the communicator's name, for the allreduce spans.
  void write_trace(const std::string& backend);

 private:
  StartupRecord startup_;
  double local_seconds(Clock::time_point t) const;   // this rank's clock (with its skew)
  double common_seconds(Clock::time_point t) const;  // on rank 0's clock

  const Config& config_;
  WorkerEnv env_;
  InjectedFaults faults_;
  comm::Store* store_ = nullptr;
  ClockEstimate clock_;
  PhaseTimes times_;
  PhaseTimes::Snapshot epoch_start_;
  PhaseTimes::Snapshot end_;
  std::vector<double> arrivals_;  // this epoch's, on rank 0's clock
  StragglerCount straggler_;
  std::optional<Straggler> epoch_straggler_;  // the previous epoch's, for straggler_news
  std::optional<std::string> straggler_news_;
};

}  // namespace partrain
