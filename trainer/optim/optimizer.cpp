#include "trainer/optim/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace partrain {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& cfg,
                                                        std::vector<at::Tensor> parameters) {
  if (cfg.name == OptimizerName::kAdamW) {
    return std::make_unique<torch::optim::AdamW>(std::move(parameters),
                                                 torch::optim::AdamWOptions(cfg.lr)
                                                     .betas(std::make_tuple(cfg.beta1, cfg.beta2))
                                                     .eps(cfg.eps)
                                                     .weight_decay(cfg.weight_decay));
  }
  return std::make_unique<torch::optim::SGD>(std::move(parameters),
                                             torch::optim::SGDOptions(cfg.lr)
                                                 .momentum(cfg.momentum)
                                                 .nesterov(cfg.nesterov)
                                                 .weight_decay(cfg.weight_decay));
}

}  // namespace partrain
