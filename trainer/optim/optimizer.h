// defines: make_optimizer() — the optimizer train.optimizer names (sgd, adamw), over a
// model's parameters.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "trainer/config/config.h"

namespace torch::optim {
class Optimizer;
}

namespace partrain {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<at::Tensor> parameters);

}  // namespace partrain
