// defines: EpochLoop — the epochs of one rank's run: train an epoch, share the BatchNorm
// statistics, evaluate, record and log the epoch, checkpoint; until train.epochs,
// train.max_steps, or a stop signal (then a checkpoint of the step it stopped at). After each
// optimizer step the ranks agree through the step exchange (step_exchange.h) whether to stop
// or to take a mid-epoch checkpoint; with data.balance auto also on each rank's compute time per
// sample, from which every rank derives the same new split (BalanceControl, balance_control.h).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/data/loader.h"
#include "trainer/loop/balance_control.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/observer.h"
#include "trainer/loop/train_step.h"
#include "trainer/loop/worker.h"
#include "trainer/model/train_model.h"
#include "trainer/parallel/strategy.h"
#include "trainer/report/report_writer.h"

namespace partrain {

class MetricsLog;
class Progress;
class TensorBoardLog;

// What the loop trains with; it owns none of it.
struct EpochLoopParts {
  TrainModel& model;
  Strategy& strategy;
  TrainStep& step;
  data::Loader& train;
  data::Loader& test;
  Checkpointer& checkpointer;
  RunObserver& observer;  // the loop and the step mark its phase timers
  c10::Device device;
};

class EpochLoop {
 public:
  EpochLoop(const Config& config, const WorkerEnv& env, EpochLoopParts parts);

  // Trains from `start` (epochs done and steps taken, and where in the next epoch when it is
  // a mid-epoch checkpoint; zero when fresh) to the end of the run, or to the step at which
  // the ranks agreed to stop (see stopped()).
  void run(const TrainingPosition& start);

  // After run(): set when the run stopped at a stop signal, with the step it saved.
  struct Stopped {
    std::int64_t step = 0;
    std::string checkpoint;  // the file's name in the checkpoint folder
    int stop_requests = 0;   // how many ranks got a stop signal
  };
  const std::optional<Stopped>& stopped() const { return stopped_; }
  // Whether the ranks have exchanged a step (after_step()) in this run: until then a stop
  // signal has no step of theirs to agree on.
  bool agreed_on_a_step() const { return agreed_on_a_step_; }

  // Every epoch of the run, those before a resume included (for the report).
  const std::vector<EpochRecord>& epochs() const { return epochs_; }
  // Training time of this rank outside the wait for gradient averaging.
  double compute_seconds() const { return compute_seconds_; }
  // Global-batch mode: the split at the end and auto's changes of it (report.json's "balance").
  std::optional<BalanceRecord> balance() const { return balance_.record(); }

 private:
  struct EpochTotals {
    double loss_sum = 0;  // training loss summed over this rank's images
    double images = 0;
    double seconds = 0;  // training time before this run's part of the epoch (a resume's)
  };
  // Trains epoch `epoch` from batch `first_batch`, with `before` the totals of the batches
  // before it (a mid-epoch resume). Returns the epoch's totals; stopped_ is set when the
  // ranks agreed to stop.
  EpochTotals train_epoch(int epoch, std::int64_t first_batch, const EpochTotals& before,
                          MetricsLog* metrics, TensorBoardLog* tensorboard, Progress& progress);
  // Writes the optimizer steps held for TensorBoard (one device-to-host copy for all of them).
  void write_held_steps(TensorBoardLog& tensorboard);
  // After an optimizer step: the step exchange, then a mid-epoch checkpoint when it is due or
  // the ranks stop. True to stop.
  bool after_step(int epoch, std::int64_t batches_done, const at::Tensor& running_loss,
                  EpochTotals so_far);
  // Returns the checkpoint's file name.
  std::string save_mid_epoch(int epoch, std::int64_t batches_done, const EpochTotals& so_far);
  EpochTotals resumed_totals(const MidEpoch& mid) const;
  bool reached_max_steps() const;

  const Config& config_;
  WorkerEnv env_;
  EpochLoopParts parts_;
  std::vector<EpochRecord> epochs_;
  std::int64_t step_ = 0;
  double compute_seconds_ = 0;
  std::optional<Stopped> stopped_;
  bool agreed_on_a_step_ = false;
  BalanceControl balance_;  // global-batch mode's split of each micro-step over the ranks
  // Rank 0, observe.tensorboard: each optimizer step's loss (on the device, so that logging it
  // does not wait for the device every step), learning rate and end, until written.
  struct HeldStep {
    std::int64_t step = 0;
    at::Tensor loss;
    double lr = 0;
    double wall_time = 0;
  };
  std::vector<HeldStep> held_steps_;
};

}  // namespace partrain
