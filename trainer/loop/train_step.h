// defines: TrainStep, TrainStepOptions and classification_loss() — one batch of training:
// forward (under autocast for bf16/f16), loss (with label smoothing), backward (of the
// loss-scaled loss for f16), and on the last batch of an accumulation group the update at the
// schedule's rate, which the strategy carries out (Strategy::finish_backward() and step()).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "trainer/config/config.h"
#include "trainer/model/train_model.h"
#include "trainer/observe/phase_times.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/parallel/strategy.h"
#include "trainer/precision/precision.h"

namespace partrain {

struct TrainStepOptions {
  double label_smoothing = 0.0;
  double clip_grad_norm = 0.0;  // 0: off
};

// What train.label_smoothing and train.clip_grad_norm ask for.
TrainStepOptions train_step_options(const TrainConfig& train);

// Mean cross-entropy of `logits` [N, K] against `labels` [N], computed in f32. With label
// smoothing e the target is (1 - e) on the label plus e / K on every class (PyTorch's
// definition): (1 - e) * CE + e * mean over k of -log p_k.
at::Tensor classification_loss(const at::Tensor& logits, const at::Tensor& labels,
                               double label_smoothing = 0.0);

class TrainStep {
 public:
  TrainStep(TrainStepOptions options, PrecisionPlugin precision, Strategy& strategy,
            LrSchedule schedule);

  // `step`: the optimizer steps taken before this batch (the schedule's position). sync: this
  // batch ends its accumulation group of `group_size` batches, whose gradient is the mean
  // over the group, and the update follows. Returns the batch's mean loss (detached).
  at::Tensor run(TrainModel& model, const at::Tensor& images, const at::Tensor& labels, bool sync,
                 std::int64_t group_size, std::int64_t step);

  double learning_rate() const { return lr_; }  // of the last update
  // The most CPU tensor memory one batch's forward and backward allocated above what was alive
  // when it began, over every batch after the first optimizer step (whose backward also makes
  // what stays: .grad, the optimizer's state); bytes (device/tensor_memory.h).
  std::int64_t step_peak_bytes() const { return step_peak_bytes_; }
  // Updates skipped because the f16 gradients were not finite (they count as steps).
  std::int64_t skipped_steps() const { return skipped_; }
  void set_skipped_steps(std::int64_t n) { skipped_ = n; }
  PrecisionPlugin& precision() { return precision_; }
  // From here on, run() marks forward, backward, comm_exposed and optimizer in `times`.
  void time_phases(PhaseTimes& times) { times_ = &times; }
  // Test-only (PARTRAIN_TEST_SAMPLE_DELAY): forward waits this long per sample, as a slower
  // device would take.
  void slow_forward(double seconds_per_sample) { sample_delay_s_ = seconds_per_sample; }

 private:
  void update(std::int64_t step, Clock::time_point since);
  // The end of `phase` (begun at `since`) in times_, if any; returns the phase's end.
  Clock::time_point mark(Phase phase, Clock::time_point since) {
    return times_ ? times_->mark(phase, since) : since;
  }

  TrainStepOptions options_;
  Strategy& strategy_;
  LrSchedule schedule_;
  PrecisionPlugin precision_;
  double lr_ = 0;
  std::int64_t skipped_ = 0;
  PhaseTimes* times_ = nullptr;
  double sample_delay_s_ = 0;
  std::int64_t step_peak_bytes_ = 0;
};

}  // namespace partrain
