#include "trainer/train/optimizer.h"

#include <torch/optim/sgd.h>

namespace partrain {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& cfg,
                                                        std::vector<at::Tensor> parameters) {
  return std::make_unique<torch::optim::SGD>(
      std::move(parameters),
      torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));
}

}  // namespace partrain
