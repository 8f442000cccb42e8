// defines: the DataParallel checks, for any device list: BatchNorm statistics kept from
// device 0's piece, outputs as the replicas compute them, gradients from every replica,
// and evaluation that matches the model's own forward. Run on CPU devices by
// data_parallel_test.cpp and on CUDA devices by tests/gpu.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "trainer/parallel/data_parallel.h"
#include "trainer/model/models.h"

namespace partrain::dp_checks {

inline torch::nn::Sequential make_net(Norm norm, const torch::Device& device) {
  ModelConfig c;
  c.name = ModelName::kDigitalNet;
  c.width = 4;
  c.norm = norm;
  torch::manual_seed(5);
  auto net = make_model(c, ModelShape{3, 16, 10});
  net->to(device);
  return net;
}

inline std::shared_ptr<torch::nn::SequentialImpl> copy_of(const torch::nn::Sequential& net) {
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  copy->train(net->is_training());
  return copy;
}

inline torch::Tensor images(int64_t n, const torch::Device& device) {
  auto gen = at::detail::createCPUGenerator(77);
  return at::randn({n, 3, 16, 16}, gen).to(device);
}

inline bool close(const torch::Tensor& a, const torch::Tensor& b, double tolerance) {
  return a.sizes() == b.sizes() &&
         (a.to(torch::kCPU, torch::kDouble) - b.to(torch::kCPU, torch::kDouble))
                 .abs()
                 .max()
                 .item<double>() <= tolerance;
}

// A training forward leaves in the model the buffers of device 0's piece, and returns what
// each replica computes from the model as it was before.
inline void expect_batchnorm_statistics_kept(const std::vector<torch::Device>& devices,
                                             double tolerance) {
  auto net = make_net(Norm::kBatch, devices[0]);
  auto before = copy_of(net);
  const auto x = images(8, devices[0]);
  const auto pieces = x.chunk(static_cast<int64_t>(devices.size()), 0);

  torch::Tensor out = data_parallel_forward(*net, x, devices, devices[0]);

  // Each piece through its own copy of the model as it was; copy 0 is what the model must
  // now hold.
  std::vector<std::shared_ptr<torch::nn::SequentialImpl>> copies;
  std::vector<torch::Tensor> expected;
  for (const auto& piece : pieces) {
    copies.push_back(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(before->clone()));
    expected.push_back(copies.back()->forward(piece));
  }
  const auto& reference = copies[0];
  EXPECT_TRUE(close(out, torch::cat(expected, 0), tolerance));

  const auto kept = net->named_buffers();
  const auto want = reference->named_buffers();
  const auto initial = before->named_buffers();
  ASSERT_EQ(kept.size(), want.size());
  ASSERT_GT(kept.size(), 0u);
  for (std::size_t i = 0; i < kept.size(); ++i) {
    SCOPED_TRACE(kept[i].key());
    EXPECT_EQ(kept[i].value().device(), devices[0]);
    EXPECT_TRUE(close(kept[i].value(), want[i].value(), tolerance));
    // Every statistic moved away from its initial value (mean 0, variance 1, count 0).
    EXPECT_FALSE(close(kept[i].value(), initial[i].value(), 1e-6));
  }
  EXPECT_EQ(net->named_buffers()["bn1.num_batches_tracked"].item<int64_t>(), 1);
}

// The gradients of a batch split over the devices (evenly, or by `weights`) are those of the
// whole batch on one, and so are the outputs.
inline void expect_gradients_of_every_replica(const std::vector<torch::Device>& devices,
                                              double tolerance,
                                              const std::vector<double>& weights = {}) {
  auto net = make_net(Norm::kNone, devices[0]);
  auto twin = copy_of(net);
  const int64_t n = 2 * static_cast<int64_t>(devices.size()) + 1;  // pieces of unequal size
  const auto x = images(n, devices[0]);
  const auto y =
      torch::arange(n, torch::TensorOptions().dtype(torch::kLong).device(devices[0])) % 10;

  const auto split = data_parallel_forward(*net, x, devices, devices[0], weights);
  const auto whole = twin->forward(x);
  EXPECT_TRUE(close(split, whole, tolerance));
  torch::nn::functional::cross_entropy(split, y).backward();
  torch::nn::functional::cross_entropy(whole, y).backward();

  const auto ours = net->named_parameters();
  const auto theirs = twin->named_parameters();
  ASSERT_EQ(ours.size(), theirs.size());
  for (std::size_t i = 0; i < ours.size(); ++i) {
    SCOPED_TRACE(ours[i].key());
    EXPECT_TRUE(ours[i].value().is_leaf());
    ASSERT_TRUE(ours[i].value().grad().defined());
    EXPECT_EQ(ours[i].value().grad().device(), devices[0]);
    EXPECT_TRUE(close(ours[i].value().grad(), theirs[i].value().grad(), tolerance));
  }
}

// In evaluation the replicas normalise with the model's running statistics, so the split
// forward equals the model's own.
inline void expect_evaluation_matches_the_model(const std::vector<torch::Device>& devices,
                                                double tolerance) {
  auto net = make_net(Norm::kBatch, devices[0]);
  data_parallel_forward(*net, images(8, devices[0]), devices, devices[0]);  // statistics move
  net->eval();
  torch::NoGradGuard no_grad;
  const auto x = images(6, devices[0]) * 2 + 1;
  EXPECT_TRUE(
      close(data_parallel_forward(*net, x, devices, devices[0]), net->forward(x), tolerance));
}

}  // namespace partrain::dp_checks
