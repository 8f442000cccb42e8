// Whole runs of the built executable (PARTRAIN_EXE): training that learns, reproducibility,
// DDP against one process, uneven shards, a killed rank, resuming, and bad input. Small
// models and few steps, so the file stays within a couple of minutes on 2 cores.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string exe() {
  const char* e = std::getenv("PARTRAIN_EXE");
  return e ? e : PARTRAIN_EXE_DEFAULT;
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("partrain_run_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Result {
  int code = -1;
  std::string output;
};

// Runs `partrain ARGS` under `timeout`, output (stdout+stderr) captured.
Result partrain(const std::string& args, const fs::path& dir, int timeout_s = 240) {
  fs::path log = dir / "output.txt";
  std::string cmd = "timeout -k 5 " + std::to_string(timeout_s) + " " + exe() + " " + args + " > " +
                    log.string() + " 2>&1";
  int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

// A small synthetic run; `body` adds the keys the base does not set (a key set twice is a
// config error); tests change base keys with --set.
fs::path write_config(const fs::path& dir, const std::string& body) {
  fs::path path = dir / "config.yaml";
  std::ofstream(path) << "name: test\nseed: 1\ndevice: cpu\n"
                      << "data: {dataset: synthetic, synthetic_train: 1200, synthetic_test: 400, "
                         "batch_size: 32, num_workers: 1}\n"
                      << "model: {name: digitalnet, width: 8, norm: batch}\n"
                      << "comm: {timeout_s: 30}\n"
                      << "checkpoint: {every_epochs: 1, keep: 2, resume: never}\n"
                      << "output: {dir: " << (dir / "out").string() << "}\n"
                      << body;
  return path;
}

Json read_report(const fs::path& dir) {
  std::ifstream in(dir / "out" / "report.json");
  EXPECT_TRUE(in.good()) << "no report in " << dir;
  return Json::parse(in);
}

std::vector<double> epoch_losses(const fs::path& dir) {
  std::vector<double> losses;
  Json report = read_report(dir);  // kept alive: iterating a member of a temporary dangles
  for (const auto& e : report["epochs"]) losses.push_back(e["train_loss"].get<double>());
  return losses;
}

TEST(Run, SingleProcessLearnsAndReports) {
  auto dir = scratch("single");
  auto cfg = write_config(dir, "strategy: single\ntrain: {epochs: 2, threads: 1, optimizer: {lr: 0.05}}\n");
  Result r = partrain("run " + cfg.string(), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  Json report = read_report(dir);
  EXPECT_EQ(report["schema"], "partrain.report/1");
  EXPECT_EQ(report["env"]["world_size"], 1);
  EXPECT_EQ(report["env"]["backend"], "none");
  ASSERT_EQ(report["epochs"].size(), 2u);
  double first = report["epochs"][0]["train_loss"], second = report["epochs"][1]["train_loss"];
  EXPECT_LT(second, first);
  // 100 classes: chance is 1%.
  EXPECT_GT(report["final"]["test_accuracy"].get<double>(), 0.10) << r.output;
  EXPECT_GT(report["ranks"][0]["peak_rss_mb"].get<double>(), 10.0);
  EXPECT_GT(report["images_per_s"].get<double>(), 0.0);
  EXPECT_TRUE(fs::exists(dir / "out" / "metrics.jsonl"));
  EXPECT_TRUE(fs::exists(dir / "out" / "metrics.csv"));
  EXPECT_TRUE(fs::exists(dir / "out" / "checkpoints" / "latest.json"));
  EXPECT_NE(r.output.find("epoch 2/2 done"), std::string::npos) << r.output;
}

TEST(Run, SameConfigTwiceGivesSameLosses) {
  auto a = scratch("repeat_a"), b = scratch("repeat_b");
  const std::string body = "strategy: ddp\nlaunch: {nproc_per_node: 2}\ntrain: {epochs: 1, max_steps: 12, threads: 1}\n";
  const std::string ring = " --set comm.backend=asio-ring";
  ASSERT_EQ(partrain("run " + write_config(a, body).string() + ring, a).code, 0);
  ASSERT_EQ(partrain("run " + write_config(b, body).string() + ring, b).code, 0);
  EXPECT_EQ(epoch_losses(a), epoch_losses(b));
  EXPECT_EQ(read_report(a)["final"]["test_loss"], read_report(b)["final"]["test_loss"]);
}

// Without BatchNorm, 2 ranks at batch 16 see, step by step, the samples one process sees
// at batch 32, and the averaged gradients are the same: the losses agree to float rounding.
void expect_ddp_matches_single(const std::string& backend) {
  auto single = scratch("eq_single_" + backend), ddp = scratch("eq_ddp_" + backend);
  const std::string no_bn = " --set model.norm=none";
  auto cfg1 = write_config(single, "strategy: single\ntrain: {epochs: 2, threads: 1}\n");
  auto cfg2 = write_config(ddp, "strategy: ddp\nlaunch: {nproc_per_node: 2}\n"
                                "train: {epochs: 2, threads: 1}\n");
  Result r1 = partrain("run " + cfg1.string() + no_bn + " --set data.batch_size=32", single);
  ASSERT_EQ(r1.code, 0) << r1.output;
  Result r2 = partrain("run " + cfg2.string() + no_bn + " --set data.batch_size=16 --set comm.backend=" + backend, ddp);
  ASSERT_EQ(r2.code, 0) << r2.output;
  auto l1 = epoch_losses(single), l2 = epoch_losses(ddp);
  ASSERT_EQ(l1.size(), 2u);
  ASSERT_EQ(l2.size(), 2u);
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l2[i], 1e-4 * std::abs(l1[i])) << "epoch " << i + 1;
  double acc1 = read_report(single)["final"]["test_accuracy"], acc2 = read_report(ddp)["final"]["test_accuracy"];
  EXPECT_NEAR(acc1, acc2, 0.006);  // at most a couple of the 400 test images flip
}

TEST(Run, DdpAsioRingMatchesSingleProcess) { expect_ddp_matches_single("asio-ring"); }
TEST(Run, DdpGlooMatchesSingleProcess) { expect_ddp_matches_single("gloo"); }

TEST(Run, ThreeRanksWithUnevenDatasetFinish) {
  auto dir = scratch("uneven");
  // 1001 samples over 3 ranks at batch 32: padded shards and a short last batch.
  auto cfg = write_config(dir, "strategy: ddp\nlaunch: {nproc_per_node: 3}\ntrain: {epochs: 1, threads: 1}\n");
  Result r = partrain("run " + cfg.string() + " --set comm.backend=asio-ring --set data.synthetic_train=1001 "
                      "--set data.synthetic_test=101", dir, 180);
  ASSERT_EQ(r.code, 0) << r.output;
  Json report = read_report(dir);
  EXPECT_EQ(report["env"]["world_size"], 3);
  EXPECT_EQ(report["ranks"].size(), 3u);
  EXPECT_EQ(report["epochs"][0]["images"], 1002);  // 3 x ceil(1001 / 3)
}

TEST(Run, KilledRankStopsTheRunNamingIt) {
  auto dir = scratch("kill");
  auto cfg = write_config(dir, "strategy: ddp\nlaunch: {nproc_per_node: 2}\ntrain: {epochs: 50, threads: 1, log_every: 1}\n");
  fs::path log = dir / "output.txt";
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    FILE* out = freopen(log.c_str(), "w", stdout);
    (void)out;
    dup2(fileno(stdout), fileno(stderr));
    execl(exe().c_str(), exe().c_str(), "run", cfg.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until training runs, then find the worker whose RANK is 1 among the launcher's children.
  auto contains = [&](const std::string& text) {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str().find(text) != std::string::npos;
  };
  auto deadline = Clock::now() + std::chrono::seconds(120);
  while (!contains("step") && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(contains("step")) << "training never started";
  pid_t victim = 0;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::ifstream stat(entry.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    if (!(stat >> pid >> comm >> state >> ppid) || ppid != launcher) continue;
    std::ifstream environ(entry.path() / "environ");
    std::string var;
    while (std::getline(environ, var, '\0')) {
      if (var == "RANK=1") victim = std::stoi(pid);
    }
  }
  ASSERT_GT(victim, 0) << "no worker with RANK=1 under the launcher";
  kill(victim, SIGKILL);
  auto killed_at = Clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(launcher, &status, WNOHANG)) == 0 && Clock::now() - killed_at < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  if (done == 0) {
    kill(launcher, SIGKILL);
    waitpid(launcher, &status, 0);
    FAIL() << "partrain run did not stop within 30 s of a rank's death";
  }
  EXPECT_LT(seconds, 10.0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_TRUE(contains("rank 1")) << "the dead rank is not named";
  EXPECT_TRUE(contains("SIGKILL")) << "the signal is not named";
}

TEST(Run, ResumeContinuesExactlyWhereItStopped) {
  auto straight = scratch("straight"), resumed = scratch("resumed");
  const std::string body = "strategy: single\ntrain: {epochs: 2, threads: 1}\n";
  ASSERT_EQ(partrain("run " + write_config(straight, body).string(), straight).code, 0);
  auto cfg = write_config(resumed, body);
  ASSERT_EQ(partrain("run " + cfg.string() + " --set train.epochs=1", resumed).code, 0);
  Result r = partrain("run " + cfg.string() + " --set checkpoint.resume=auto", resumed);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(epoch_losses(straight), epoch_losses(resumed));
}

TEST(Run, BadInputExitsTwoWithOneLine) {
  auto dir = scratch("bad");
  auto cfg = write_config(dir, "strategy: single\n");
  Result r = partrain("run " + cfg.string() + " --set data.batch_size=-1", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("data.batch_size"), std::string::npos) << r.output;
  r = partrain("run " + cfg.string() + " --set strategy=dp", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("CUDA"), std::string::npos) << r.output;
  r = partrain("run " + cfg.string() + " --set data.dataset=cifar100 --set data.root=/nonexistent", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("/nonexistent"), std::string::npos) << r.output;
}

}  // namespace
