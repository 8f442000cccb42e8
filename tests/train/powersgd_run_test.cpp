// Whole runs of the built executable with comm.compression powersgd: 2 ranks on the CPU
// learn, report what they sent, and a run stopped after an epoch and resumed from its
// checkpoint (factors, error buffers and step count included) ends exactly as the run that
// never stopped.
#include "tests/train/run_harness.h"

namespace partrain_test {
namespace {

const std::string kPowerSgd =
    "strategy: ddp\nlaunch: {nproc_per_node: 2}\n"
    "comm: {backend: asio-ring, timeout_s: 30, compression: powersgd, powersgd_rank: 2, "
    "powersgd_start_step: 3}\n";

fs::path powersgd_config(const fs::path& dir, const std::string& train) {
  // The base config sets comm: {timeout_s: 30}; this one replaces the comm section.
  fs::path path = write_config(dir, "");
  std::string text = read_text(path);
  const std::string base_comm = "comm: {timeout_s: 30}\n";
  text.replace(text.find(base_comm), base_comm.size(), kPowerSgd + train);
  std::ofstream(path) << text;
  return path;
}

TEST(PowerSgdRun, TrainsReportsAndResumesExactly) {
  auto straight = scratch("powersgd_straight"), resumed = scratch("powersgd_resumed");
  const std::string train = "train: {epochs: 3, threads: 1}\n";
  Result r = partrain("run " + powersgd_config(straight, train).string(), straight);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<double> losses = epoch_losses(straight);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_LT(losses[2], losses[0]) << "the training loss did not fall";

  Json report = read_report(straight);
  EXPECT_EQ(report["config"]["comm"]["compression"], "powersgd");
  const Json& compression = report["compression"];
  EXPECT_EQ(compression["method"], "powersgd");
  EXPECT_EQ(compression["rank"], 2);
  EXPECT_GT(compression["compressed_matrices"].get<int>(), 0);
  const double sent = compression["bytes_per_step"].get<double>();
  const double plain = compression["uncompressed_bytes_per_step"].get<double>();
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent, plain / 4) << "rank 2 of digitalnet's convolutions sends far less";

  // Two epochs in, stop; then resume from the checkpoint for the third.
  auto cfg = powersgd_config(resumed, train);
  ASSERT_EQ(partrain("run " + cfg.string() + " --set train.epochs=2", resumed).code, 0);
  r = partrain("run " + cfg.string() + " --set checkpoint.resume=auto", resumed);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(epoch_losses(resumed), losses);
  EXPECT_EQ(read_report(resumed)["final"]["test_loss"], report["final"]["test_loss"]);
}

// In global-batch mode a PowerSGD run resumes at another world size: two ranks for two
// epochs, one rank for the third, ends as two ranks for all three (to the rounding of sums
// taken over another number of ranks). No BatchNorm: its statistics are per rank.
TEST(PowerSgdRun, ResumesAtAnotherWorldSizeInGlobalBatchMode) {
  auto straight = scratch("powersgd_global_straight"), shrunk = scratch("powersgd_global_shrunk");
  const std::string train = "train: {epochs: 3, threads: 1}\n";
  const std::string global =
      " --set data.batch_size=null --set data.global_batch_size=64 --set model.norm=none";
  Result r = partrain("run " + powersgd_config(straight, train).string() + global, straight);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<double> losses = epoch_losses(straight);
  ASSERT_EQ(losses.size(), 3u);

  auto cfg = powersgd_config(shrunk, train);
  ASSERT_EQ(partrain("run " + cfg.string() + global + " --set train.epochs=2", shrunk).code, 0);
  r = partrain("run " + cfg.string() + global +
                   " --set checkpoint.resume=auto --set launch.nproc_per_node=1",
               shrunk);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  const std::vector<double> resumed = epoch_losses(shrunk);
  ASSERT_EQ(resumed.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(resumed[i], losses[i], 1e-5 * std::abs(losses[i])) << "epoch " << i + 1;
  EXPECT_EQ(read_report(shrunk)["config"]["data"]["batch_size"], 64);
}

// Resuming a checkpoint written without compression starts PowerSGD afresh (its warm-up
// first), and one written at another rank is refused, naming both.
TEST(PowerSgdRun, CheckpointsWithoutOrWithOtherStateAreHandled) {
  auto dir = scratch("powersgd_mixed");
  auto cfg = powersgd_config(dir, "train: {epochs: 2, threads: 1}\n");
  ASSERT_EQ(partrain("run " + cfg.string() +
                         " --set train.epochs=1 --set comm.compression=none"
                         " --set comm.powersgd_rank=null --set comm.powersgd_start_step=null",
                     dir)
                .code,
            0);
  Result r = partrain("run " + cfg.string() + " --set checkpoint.resume=auto", dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(epoch_losses(dir).size(), 2u);

  r = partrain("run " + cfg.string() +
                   " --set checkpoint.resume=auto --set train.epochs=3 --set comm.powersgd_rank=4",
               dir);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("PowerSGD factors of rank 2 and this run has comm.powersgd_rank 4"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace partrain_test
