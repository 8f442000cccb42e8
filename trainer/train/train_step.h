// defines: TrainStep — one batch of training: forward, loss, backward, and on the last batch
// of an accumulation group the averaged gradients applied by the optimizer.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>

#include "trainer/config/config.h"
#include "trainer/train/strategy.h"
#include "trainer/train/train_model.h"

namespace torch::optim {
class Optimizer;
}

namespace partrain {

class TrainStep {
 public:
  TrainStep(const Config& config, Strategy& strategy, torch::optim::Optimizer& optimizer);

  // sync: this batch ends its accumulation group of `group_size` batches, whose gradient is
  // the mean over the group; the optimizer steps after it. Returns the batch's mean loss
  // (detached).
  at::Tensor run(TrainModel& model, const at::Tensor& images, const at::Tensor& labels, bool sync,
                 std::int64_t group_size);

  double learning_rate() const;  // what the next optimizer step uses

 private:
  const Config& config_;
  Strategy& strategy_;
  torch::optim::Optimizer& optimizer_;
};

}  // namespace partrain
