// The optimizer's state is made with the optimizer, before the first step (so that it lies below
// the step's transient memory), and training with it is LibTorch's own to the bit: AdamW, SGD
// with momentum, Nesterov and weight decay, stepped side by side with the optimizer LibTorch
// builds, which makes its state inside the first step. Plain SGD keeps none; a frozen parameter
// gets none.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "trainer/optim/optimizer.h"

namespace partrain {
namespace {

std::vector<at::Tensor> parameters(int seed) {
  torch::manual_seed(seed);
  return {torch::randn({7, 5}), torch::randn({5}), torch::randn({3, 2, 2})};
}

std::unique_ptr<torch::optim::Optimizer> libtorch_optimizer(const OptimizerConfig& c,
                                                            std::vector<at::Tensor> p) {
  if (c.name == OptimizerName::kAdamW) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(c.lr)
                                                        .betas(std::make_tuple(c.beta1, c.beta2))
                                                        .eps(c.eps)
                                                        .weight_decay(c.weight_decay));
  }
  return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(c.lr)
                                                    .momentum(c.momentum)
                                                    .nesterov(c.nesterov)
                                                    .weight_decay(c.weight_decay));
}

std::int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  std::int64_t bytes = 0;
  for (const at::Tensor& t : tensors) bytes += static_cast<std::int64_t>(t.nbytes());
  return bytes;
}

void expect_steps_equal_libtorch(const OptimizerConfig& config, int states_per_parameter) {
  std::vector<at::Tensor> ours = parameters(3), theirs = parameters(3);
  auto made = make_optimizer(config, ours);
  auto reference = libtorch_optimizer(config, theirs);
  EXPECT_EQ(state_bytes(*made), states_per_parameter * bytes_of(ours));
  EXPECT_EQ(state_bytes(*reference), 0);
  torch::manual_seed(11);
  for (int step = 0; step < 4; ++step) {
    for (std::size_t i = 0; i < ours.size(); ++i) {
      at::Tensor g = torch::randn(ours[i].sizes());
      ours[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g.clone();
    }
    made->step();
    reference->step();
    for (std::size_t i = 0; i < ours.size(); ++i) {
      ASSERT_TRUE(torch::equal(ours[i], theirs[i])) << "step " << step << ", tensor " << i;
    }
  }
  EXPECT_EQ(state_bytes(*made), state_bytes(*reference));
}

TEST(OptimizerState, AdamWIsMadeWithTheOptimizerAndStepsAsLibTorch) {
  OptimizerConfig c;
  c.name = OptimizerName::kAdamW;
  c.lr = 0.01;
  c.weight_decay = 0.01;
  expect_steps_equal_libtorch(c, 2);
}

TEST(OptimizerState, SgdMomentumIsMadeWithTheOptimizerAndStepsAsLibTorch) {
  OptimizerConfig c;
  expect_steps_equal_libtorch(c, 1);
  c.nesterov = true;
  c.weight_decay = 0;
  expect_steps_equal_libtorch(c, 1);
}

TEST(OptimizerState, PlainSgdKeepsNone) {
  OptimizerConfig c;
  c.momentum = 0;
  expect_steps_equal_libtorch(c, 0);
}

TEST(OptimizerState, AFrozenParameterGetsNone) {
  torch::nn::Linear layer(4, 3);
  layer->bias.set_requires_grad(false);
  OptimizerConfig c;
  c.name = OptimizerName::kAdamW;
  ReplicatedOptimizer optimizer(c, *layer);
  EXPECT_EQ(optimizer.state_bytes(), 2 * static_cast<std::int64_t>(layer->weight.nbytes()));
}

}  // namespace
}  // namespace partrain
