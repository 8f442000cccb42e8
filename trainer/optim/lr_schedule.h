// defines: LrSchedule — the learning rate of every optimizer step (train.schedule): a linear
// warmup, then constant, step decay or cosine decay. LibTorch-free.
//
// With s the optimizer step (0 is the run's first), W = warmup_steps, T = the run's total
// steps and lr the optimizer's rate:
//
//   s < W      lr * (s + 1) / W                      the warmup's last step reaches lr
//   constant   lr
//   step       lr * gamma ^ floor((s - W) / step_size)
//   cosine     min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,  p = min(1, (s - W + 1) / (T - W))
//              so the run's last step (s = T - 1) trains at min_lr
//
// The rate is a function of s alone, so a resumed run continues the schedule from the step
// count its checkpoint holds.
#pragma once

#include <cstdint>

#include "trainer/config/config.h"

namespace partrain {

class LrSchedule {
 public:
  // total_steps: optimizer steps in the whole run (where cosine ends).
  LrSchedule(const ScheduleConfig& config, double base_lr, std::int64_t total_steps);

  double lr_at(std::int64_t step) const;

 private:
  ScheduleConfig config_;
  double base_lr_;
  std::int64_t total_steps_;
};

// Optimizer steps in a run of `epochs` epochs of `batches_per_epoch` batches each, a step
// every `accumulate_steps` batches (and at the end of every epoch), capped by max_steps > 0.
std::int64_t total_optimizer_steps(const TrainConfig& train, std::int64_t batches_per_epoch);

}  // namespace partrain
