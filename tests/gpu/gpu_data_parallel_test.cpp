// DataParallel on CUDA devices: the checks of tests/train/data_parallel_test.cpp, over two
// replicas on cuda:0 (any GPU machine) and over every visible GPU where there are several.
// Skips where LibTorch sees no CUDA device.
#include "tests/train/data_parallel_checks.h"

namespace partrain {
namespace {

using namespace dp_checks;

std::vector<std::vector<torch::Device>> device_lists() {
  std::vector<std::vector<torch::Device>> lists{
      {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 0)}};
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (count > 1) {
    std::vector<torch::Device> all;
    for (int i = 0; i < count; ++i)
      all.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
    lists.push_back(all);
  }
  return lists;
}

// cuDNN's TF32 and its choice of algorithm per batch size round differently.
constexpr double kTolerance = 1e-4;

class GpuDataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "LibTorch sees no CUDA device here";
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
};

TEST_F(GpuDataParallel, KeepsTheBatchNormStatisticsOfDeviceZero) {
  for (const auto& devices : device_lists()) expect_batchnorm_statistics_kept(devices, kTolerance);
}

TEST_F(GpuDataParallel, GradientsOfEveryReplicaReachTheModel) {
  for (const auto& devices : device_lists()) expect_gradients_of_every_replica(devices, kTolerance);
}

TEST_F(GpuDataParallel, EvaluationMatchesTheModel) {
  for (const auto& devices : device_lists())
    expect_evaluation_matches_the_model(devices, kTolerance);
}

}  // namespace
}  // namespace partrain
