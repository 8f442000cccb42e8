// defines: EpochLoop — the epochs of one rank's run: train an epoch, share the BatchNorm
// statistics, evaluate, record and log the epoch, checkpoint; until train.epochs or
// train.max_steps.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/data/loader.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/observer.h"
#include "trainer/report/report_writer.h"
#include "trainer/parallel/strategy.h"
#include "trainer/loop/worker.h"
#include "trainer/model/train_model.h"
#include "trainer/loop/train_step.h"

namespace torch::optim {
class Optimizer;
}

namespace partrain {

class MetricsLog;
class Progress;

// What the loop trains with; it owns none of it.
struct EpochLoopParts {
  TrainModel& model;
  Strategy& strategy;
  TrainStep& step;
  torch::optim::Optimizer& optimizer;  // for the checkpoints
  data::Loader& train;
  data::Loader& test;
  Checkpointer& checkpointer;
  RunObserver& observer;  // the loop and the step mark its phase timers
  c10::Device device;
};

class EpochLoop {
 public:
  EpochLoop(const Config& config, const WorkerEnv& env, EpochLoopParts parts);

  // Trains from `start` (epochs done and steps taken; zero when fresh) to the end of the run.
  void run(const TrainingPosition& start);

  // Every epoch of the run, those before a resume included (for the report).
  const std::vector<EpochRecord>& epochs() const { return epochs_; }
  // Training time of this rank outside the wait for gradient averaging.
  double compute_seconds() const { return compute_seconds_; }

 private:
  struct EpochTotals {
    double loss_sum = 0;  // training loss summed over this rank's images
    double images = 0;
  };
  EpochTotals train_epoch(int epoch, MetricsLog* metrics, Progress& progress);
  bool reached_max_steps() const;

  const Config& config_;
  WorkerEnv env_;
  EpochLoopParts parts_;
  std::vector<EpochRecord> epochs_;
  std::int64_t step_ = 0;
  double compute_seconds_ = 0;
};

}  // namespace partrain
