// The CUDA path on a real GPU: single-device training, DDP over nccl with one rank (NCCL
// refuses two ranks on one GPU), two ranks sharing the GPU over gloo and asio-ring (their
// host staging), DataParallel, and device memory figures in the report. Skips without CUDA.
#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

bool have_cuda() {
  static const bool have = [] {
    auto dir = scratch("probe");
    Result r = partrain("version", dir, 60);
    return r.output.find("cuda: available") != std::string::npos;
  }();
  return have;
}

#define REQUIRE_CUDA() \
  if (!have_cuda()) GTEST_SKIP() << "LibTorch sees no CUDA device here"

const char* kCuda = "device: cuda\ntrain: {epochs: 2}\n";

void expect_cuda_report(const fs::path& dir, int world, const std::string& backend) {
  Json report = read_report(dir);
  EXPECT_EQ(report["env"]["world_size"], world);
  EXPECT_EQ(report["env"]["backend"], backend);
  ASSERT_EQ(report["ranks"].size(), static_cast<size_t>(world));
  std::vector<double> reserved;
  for (const auto& r : report["ranks"]) {
    EXPECT_EQ(r["device"], "cuda:0");
    ASSERT_TRUE(r["cuda_peak_allocated_mb"].is_number()) << r;
    EXPECT_GT(r["cuda_peak_allocated_mb"].get<double>(), 0.1);
    EXPECT_GE(r["cuda_peak_reserved_mb"].get<double>(), r["cuda_peak_allocated_mb"].get<double>());
    reserved.push_back(r["cuda_peak_reserved_mb"].get<double>());
  }
  // Ranks doing the same work hold about the same device memory: none carries a stray
  // context or another rank's tensors.
  double lo = *std::min_element(reserved.begin(), reserved.end());
  double hi = *std::max_element(reserved.begin(), reserved.end());
  EXPECT_GT(lo / hi, 0.8) << report["ranks"];
  EXPECT_GT(report["final"]["test_accuracy"].get<double>(), 0.05);
}

TEST(Gpu, SingleDevice) {
  REQUIRE_CUDA();
  auto dir = scratch("gpu_single");
  Result r = partrain(
      "run " + write_config(dir, std::string("strategy: single\n") + kCuda).string(), dir, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  expect_cuda_report(dir, 1, "none");
}

TEST(Gpu, DdpOneRankOverNccl) {
  REQUIRE_CUDA();
  auto dir = scratch("gpu_nccl");
  Result r = partrain("run " + write_config(dir, std::string("strategy: ddp\n") + kCuda).string() +
                          " --set comm.backend=nccl",
                      dir, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  expect_cuda_report(dir, 1, "nccl");
}

void two_ranks_share_the_gpu(const std::string& backend) {
  REQUIRE_CUDA();
  auto dir = scratch("gpu_two_" + backend);
  Result r = partrain(
      "run " +
          write_config(dir, std::string("strategy: ddp\nlaunch: {nproc_per_node: 2}\n") + kCuda)
              .string() +
          " --set comm.backend=" + backend,
      dir, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  expect_cuda_report(dir, 2, backend);
}

TEST(Gpu, TwoRanksShareTheGpuOverGloo) { two_ranks_share_the_gpu("gloo"); }
TEST(Gpu, TwoRanksShareTheGpuOverAsioRing) { two_ranks_share_the_gpu("asio-ring"); }

TEST(Gpu, DataParallel) {
  REQUIRE_CUDA();
  auto dir = scratch("gpu_dp");
  Result r = partrain("run " + write_config(dir, std::string("strategy: dp\n") + kCuda).string(),
                      dir, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  Json report = read_report(dir);
  EXPECT_EQ(report["env"]["strategy"], "dp");
  EXPECT_GE(report["env"]["devices"].size(), 1u);
  EXPECT_GT(report["final"]["test_accuracy"].get<double>(), 0.05);
}

}  // namespace

namespace {

using namespace partrain_test;

// f16 autocast with the loss scaler on a GPU, two ranks sharing it over asio-ring: the run
// learns, skips few steps, and a resumed run continues from the checkpoint's loss scale.
TEST(Gpu, MixedPrecisionF16TrainsAndResumesExactly) {
  REQUIRE_CUDA();
  auto straight = scratch("gpu_f16_straight"), resumed = scratch("gpu_f16_resumed");
  const std::string body =
      "strategy: ddp\nlaunch: {nproc_per_node: 2}\ncomm: {backend: asio-ring}\n"
      "device: cuda\ntrain: {epochs: 2, precision: f16}\n";
  Result r = partrain("run " + write_config(straight, body).string(), straight, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  Json report = read_report(straight);
  EXPECT_GT(report["final"]["test_accuracy"].get<double>(), 0.05);
  // A few steps at the start may overflow at the initial scale of 65536; most are taken.
  EXPECT_LT(report["epochs"][1]["skipped_steps"].get<int>(),
            report["epochs"][1]["steps"].get<int>() / 4);
  auto cfg = write_config(resumed, body);
  ASSERT_EQ(partrain("run " + cfg.string() + " --set train.epochs=1", resumed, 300).code, 0);
  r = partrain("run " + cfg.string() + " --set checkpoint.resume=auto", resumed, 300);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  // CUDA kernels may sum in another order from run to run: close, not bitwise.
  const auto a = epoch_losses(straight), b = epoch_losses(resumed);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-2 * a[i]) << "epoch " << i + 1;
}

}  // namespace
