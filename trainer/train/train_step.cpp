#include "trainer/train/train_step.h"

#include <torch/nn/functional/loss.h>
#include <torch/optim/optimizer.h>

namespace partrain {

TrainStep::TrainStep(const Config& config, Strategy& strategy, torch::optim::Optimizer& optimizer)
    : config_(config), strategy_(strategy), optimizer_(optimizer) {}

at::Tensor TrainStep::run(TrainModel& model, const at::Tensor& images, const at::Tensor& labels,
                          bool sync, std::int64_t group_size) {
  at::Tensor out = strategy_.forward(model, images);
  at::Tensor loss = torch::nn::functional::cross_entropy(out, labels);
  strategy_.prepare_for_backward(sync);
  (group_size > 1 ? loss / static_cast<double>(group_size) : loss).backward();
  if (sync) {
    strategy_.finish_backward();
    optimizer_.step();
    optimizer_.zero_grad();
  }
  return loss.detach();
}

double TrainStep::learning_rate() const { return config_.train.optimizer.lr; }

}  // namespace partrain
