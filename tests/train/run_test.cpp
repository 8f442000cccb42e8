// Whole runs of the built executable (PARTRAIN_EXE): training that learns, reproducibility,
// DDP against one process, uneven shards, a killed rank, resuming, and bad input. Small
// models and few steps, so the file stays within a couple of minutes on 2 cores.
#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

TEST(Run, SingleProcessLearnsAndReports) {
  auto dir = scratch("single");
  auto cfg = write_config(
      dir, "strategy: single\ntrain: {epochs: 2, threads: 1, optimizer: {lr: 0.05}}\n");
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
  const std::string body =
      "strategy: ddp\nlaunch: {nproc_per_node: 2}\ntrain: {epochs: 1, max_steps: 12, threads: 1}\n";
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
  auto cfg2 = write_config(ddp,
                           "strategy: ddp\nlaunch: {nproc_per_node: 2}\n"
                           "train: {epochs: 2, threads: 1}\n");
  Result r1 = partrain("run " + cfg1.string() + no_bn + " --set data.batch_size=32", single);
  ASSERT_EQ(r1.code, 0) << r1.output;
  Result r2 = partrain(
      "run " + cfg2.string() + no_bn + " --set data.batch_size=16 --set comm.backend=" + backend,
      ddp);
  ASSERT_EQ(r2.code, 0) << r2.output;
  auto l1 = epoch_losses(single), l2 = epoch_losses(ddp);
  ASSERT_EQ(l1.size(), 2u);
  ASSERT_EQ(l2.size(), 2u);
  for (size_t i = 0; i < l1.size(); ++i)
    EXPECT_NEAR(l1[i], l2[i], 1e-4 * std::abs(l1[i])) << "epoch " << i + 1;
  double acc1 = read_report(single)["final"]["test_accuracy"],
         acc2 = read_report(ddp)["final"]["test_accuracy"];
  EXPECT_NEAR(acc1, acc2, 0.006);  // at most a couple of the 400 test images flip
}

TEST(Run, DdpAsioRingMatchesSingleProcess) { expect_ddp_matches_single("asio-ring"); }
TEST(Run, DdpGlooMatchesSingleProcess) { expect_ddp_matches_single("gloo"); }

TEST(Run, ThreeRanksWithUnevenDatasetFinish) {
  auto dir = scratch("uneven");
  // 1001 samples over 3 ranks at batch 32: padded shards and a short last batch.
  auto cfg = write_config(
      dir, "strategy: ddp\nlaunch: {nproc_per_node: 3}\ntrain: {epochs: 1, threads: 1}\n");
  Result r = partrain("run " + cfg.string() +
                          " --set comm.backend=asio-ring --set data.synthetic_train=1001 "
                          "--set data.synthetic_test=101",
                      dir, 180);
  ASSERT_EQ(r.code, 0) << r.output;
  Json report = read_report(dir);
  EXPECT_EQ(report["env"]["world_size"], 3);
  EXPECT_EQ(report["ranks"].size(), 3u);
  EXPECT_EQ(report["epochs"][0]["images"], 1002);  // 3 x ceil(1001 / 3)
}

TEST(Run, KilledRankStopsTheRunNamingIt) {
  auto dir = scratch("kill");
  auto cfg = write_config(dir,
                          "strategy: ddp\nlaunch: {nproc_per_node: 2}\ntrain: {epochs: 50, "
                          "threads: 1, log_every: 1}\n");
  fs::path log = dir / "output.txt";
  pid_t launcher = start_partrain({"run", cfg.string()}, log);
  ASSERT_TRUE(wait_for_text(log, "step", std::chrono::seconds(120))) << "training never started";
  pid_t victim = find_worker(launcher, 1);
  ASSERT_GT(victim, 0) << "no worker with RANK=1 under the launcher";
  kill(victim, SIGKILL);
  auto killed_at = Clock::now();
  auto status = wait_exit(launcher, std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value()) << "partrain run did not stop within 30 s of a rank's death";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - killed_at).count(), 10.0);
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  std::string output = read_text(log);
  EXPECT_NE(output.find("rank 1"), std::string::npos) << "the dead rank is not named:\n" << output;
  EXPECT_NE(output.find("SIGKILL"), std::string::npos) << "the signal is not named:\n" << output;
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

TEST(Run, CheckpointLoadsInPythonWithTorchLoad) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no Python torch (Debian's python3-torch) to load the checkpoint with";
  }
  auto dir = scratch("python_load");
  auto cfg = write_config(dir,
                          "strategy: single\ntrain: {epochs: 1, max_steps: 3, threads: 1, "
                          "optimizer: {name: adamw}}\n");
  ASSERT_EQ(partrain("run " + cfg.string(), dir).code, 0);
  fs::path script = dir / "load.py";
  std::ofstream(script)
      << "import sys, torch\n"
         "for path in sys.argv[1:]:\n"
         "    ck = torch.load(path)\n"
         "    m = ck['model']\n"
         "    assert m['conv1.weight'].shape == (8, 3, 3, 3), m['conv1.weight'].shape\n"
         "    assert m['fc.weight'].shape == (100, 64)\n"
         "    assert not any(k.startswith('module.') for k in m)\n"
         "    o = ck['optimizer']\n"
         "    assert o['name'] == 'adamw', o['name']\n"
         "    s = o['state']['fc.weight']\n"
         "    assert s['step'] == 3 and s['exp_avg'].shape == (100, 64), s['step']\n"
         "print('loaded', len(m))\n";
  const auto ckpt = dir / "out" / "checkpoints";
  std::string cmd = "/usr/bin/python3 " + script.string() + " " +
                    (ckpt / "epoch-0001.pt").string() + " " + (ckpt / "best.pt").string() + " > " +
                    (dir / "python.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_text(dir / "python.txt");
  EXPECT_NE(read_text(dir / "python.txt").find("loaded 26"), std::string::npos)
      << read_text(dir / "python.txt");
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
  r = partrain("run " + cfg.string() + " --set data.dataset=cifar100 --set data.root=/nonexistent",
               dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("/nonexistent"), std::string::npos) << r.output;
  // --nproc-per-node: one count, or one per node, each 1..1024. (No --master-port: with one,
  // node 0 would stand in for its store for a while to tell the other nodes why it stopped,
  // Note [A node that could not start].)
  auto ddp = write_config(dir, "strategy: ddp\n");
  const std::string nodes = " --nnodes 3 --node-rank 0 --nproc-per-node ";
  for (const std::string bad : {"2,x", "0", "2,,1", "2,1,1025", "-1"}) {
    r = partrain("run " + ddp.string() + nodes + bad, dir);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.output.find("--nproc-per-node '" + bad + "': expected a count"), std::string::npos)
        << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  r = partrain("run " + ddp.string() + nodes + "2,1", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("gives 2 nodes their counts, but the run has 3"), std::string::npos)
      << r.output;
  // The same rule for the list in the config.
  r = partrain("run " + ddp.string() + " --set launch.nproc_per_node=[2,1]", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("launch.nproc_per_node in " + ddp.string() +
                          " gives 2 nodes their counts, but the run has 1"),
            std::string::npos)
      << r.output;
}

}  // namespace

namespace {

using namespace partrain_test;

std::vector<std::string> lines_of(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A resumed run's metrics.csv holds every epoch, as report.json does, and its metrics.jsonl
// has each epoch once; a fresh run into the same folder starts both anew.
TEST(Run, MetricsFilesAgreeWithTheReportAcrossResumeAndReuse) {
  auto dir = scratch("metrics");
  auto cfg = write_config(dir, "strategy: single\ntrain: {epochs: 2, threads: 1, log_every: 5}\n");
  ASSERT_EQ(
      partrain("run " + cfg.string() + " --set train.epochs=1 --set data.synthetic_train=320", dir)
          .code,
      0);
  Result r = partrain(
      "run " + cfg.string() + " --set checkpoint.resume=auto --set data.synthetic_train=320", dir);
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  const auto csv = lines_of(dir / "out" / "metrics.csv");
  ASSERT_EQ(csv.size(), 3u) << "a header and both epochs expected";
  EXPECT_EQ(csv[1].rfind("1,", 0), 0u) << csv[1];
  EXPECT_EQ(csv[2].rfind("2,", 0), 0u) << csv[2];
  auto epoch_lines = [&] {
    std::vector<int> epochs;
    for (const auto& line : lines_of(dir / "out" / "metrics.jsonl")) {
      Json j = Json::parse(line);
      if (j["type"] == "epoch") epochs.push_back(j["epoch"].get<int>());
    }
    return epochs;
  };
  EXPECT_EQ(epoch_lines(), (std::vector<int>{1, 2}));

  // A fresh run (resume: never) into the same folder: only its own epoch.
  r = partrain("run " + cfg.string() + " --set train.epochs=1 --set data.synthetic_train=320", dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(epoch_lines(), (std::vector<int>{1}));
  EXPECT_EQ(lines_of(dir / "out" / "metrics.csv").size(), 2u);
}

// The last accumulation group of an epoch may be short: 96 samples at batch 32 with
// accumulate_steps 2 make a group of two batches, then one of a single batch. Each step's
// gradient is the mean over its group, so this equals batch 64 without accumulation, whose
// two steps see the same samples (64, then 32). No BatchNorm: its statistics depend on the
// batch split.
TEST(Run, ShortLastAccumulationGroupIsAveragedOverItsOwnBatches) {
  auto acc = scratch("acc_short"), plain = scratch("acc_plain");
  const std::string body = "strategy: single\ntrain: {epochs: 1, threads: 1}\n";
  // A large rate, so that a wrongly scaled last step moves the test loss by far more than
  // float rounding does (5e-5 against 1e-8 of it).
  const std::string common =
      " --set model.norm=none --set data.synthetic_train=96 --set train.optimizer.lr=0.5";
  Result a = partrain("run " + write_config(acc, body).string() + common +
                          " --set data.batch_size=32 --set train.accumulate_steps=2",
                      acc);
  ASSERT_EQ(a.code, 0) << a.output;
  Result b = partrain(
      "run " + write_config(plain, body).string() + common + " --set data.batch_size=64", plain);
  ASSERT_EQ(b.code, 0) << b.output;
  Json ra = read_report(acc), rb = read_report(plain);
  EXPECT_EQ(ra["epochs"][0]["steps"], 2);
  EXPECT_EQ(rb["epochs"][0]["steps"], 2);
  const double la = ra["final"]["test_loss"], lb = rb["final"]["test_loss"];
  EXPECT_NEAR(la, lb, 1e-6 * std::abs(lb));
}

}  // namespace

namespace {

using namespace partrain_test;

// Clipping sees the gradients averaged over the ranks: 2 ranks at batch 16 clip exactly as
// one process at batch 32 does. (Clipping each rank's own gradients before averaging would
// scale them by other factors.) The bound is small enough that every step is clipped, which
// the third run shows: without clipping the losses differ.
TEST(Run, ClipGradNormAppliesAfterAveragingOverRanks) {
  auto single = scratch("clip_single"), ddp = scratch("clip_ddp"), free = scratch("clip_free");
  const std::string common =
      " --set model.norm=none --set train.clip_grad_norm=0.05 --set train.optimizer.lr=0.2";
  auto cfg1 = write_config(single, "strategy: single\ntrain: {epochs: 1, threads: 1}\n");
  auto cfg2 = write_config(
      ddp, "strategy: ddp\nlaunch: {nproc_per_node: 2}\ntrain: {epochs: 1, threads: 1}\n");
  auto cfg3 = write_config(free, "strategy: single\ntrain: {epochs: 1, threads: 1}\n");
  Result r1 = partrain("run " + cfg1.string() + common + " --set data.batch_size=32", single);
  ASSERT_EQ(r1.code, 0) << r1.output;
  Result r2 = partrain(
      "run " + cfg2.string() + common + " --set data.batch_size=16 --set comm.backend=asio-ring",
      ddp);
  ASSERT_EQ(r2.code, 0) << r2.output;
  Result r3 = partrain("run " + cfg3.string() +
                           " --set model.norm=none --set train.optimizer.lr=0.2 "
                           "--set data.batch_size=32",
                       free);
  ASSERT_EQ(r3.code, 0) << r3.output;
  const double l1 = read_report(single)["final"]["test_loss"];
  const double l2 = read_report(ddp)["final"]["test_loss"];
  const double l3 = read_report(free)["final"]["test_loss"];
  EXPECT_NEAR(l1, l2, 1e-4 * std::abs(l1));
  EXPECT_GT(std::abs(l1 - l3), 1e-2 * std::abs(l3)) << "clipping did not change the run";
}

// best.pt is the checkpoint of the epoch with the highest test accuracy. Epochs 3 and 4 are
// trained at a rate that wrecks the model, so the best epoch is not the last one.
TEST(Run, BestCheckpointHoldsTheBestEpoch) {
  auto dir = scratch("best");
  auto cfg = write_config(dir, "strategy: single\ntrain: {epochs: 2, threads: 1}\n");
  ASSERT_EQ(partrain("run " + cfg.string() + " --set checkpoint.keep=4", dir).code, 0);
  Result r = partrain("run " + cfg.string() +
                          " --set checkpoint.keep=4 --set checkpoint.resume=auto "
                          "--set train.epochs=4 --set train.optimizer.lr=50",
                      dir);
  ASSERT_EQ(r.code, 0) << r.output;
  Json report = read_report(dir);
  ASSERT_EQ(report["epochs"].size(), 4u);
  int best = 0;
  double best_accuracy = -1;
  for (const auto& e : report["epochs"]) {
    if (e["test_accuracy"].get<double>() > best_accuracy) {
      best_accuracy = e["test_accuracy"].get<double>();
      best = e["epoch"].get<int>();
    }
  }
  ASSERT_LT(best, 4) << "the wrecked epochs came out best; the test shows nothing";
  char name[32];
  std::snprintf(name, sizeof(name), "epoch-%04d.pt", best);
  const auto ckpt = dir / "out" / "checkpoints";
  ASSERT_TRUE(fs::exists(ckpt / "best.pt"));
  EXPECT_EQ(read_text(ckpt / "best.pt"), read_text(ckpt / name)) << "best.pt is not " << name;
  // top-5 is reported beside top-1, and is at least as high.
  for (const auto& e : report["epochs"])
    EXPECT_GE(e["test_accuracy_top5"].get<double>(), e["test_accuracy"].get<double>());
  EXPECT_TRUE(report["final"].contains("test_accuracy_top5"));
}

// bf16 autocast trains on the CPU; f16 there is refused with one line (exit 2), from the
// config when it says device: cpu, and at start when device auto finds no GPU.
TEST(Run, PrecisionBf16TrainsAndF16OnTheCpuIsRefused) {
  auto dir = scratch("precision");
  auto cfg = write_config(
      dir, "strategy: single\ntrain: {epochs: 1, threads: 1, precision: bf16, max_steps: 20}\n");
  Result r = partrain("run " + cfg.string(), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  const double bf16 = read_report(dir)["epochs"][0]["train_loss"];
  EXPECT_EQ(read_report(dir)["config"]["train"]["precision"], "bf16");
  // The note on slow bf16 convolutions comes exactly when the CPU lacks what oneDNN's need,
  // as the kernel reports the CPU's flags.
  const std::string flags = read_text("/proc/cpuinfo");
  const bool onednn_bf16 = flags.find(" avx512bw") != std::string::npos &&
                           flags.find(" avx512vl") != std::string::npos &&
                           flags.find(" avx512dq") != std::string::npos;
  EXPECT_EQ(
      r.output.find("note: train.precision bf16 on a CPU without AVX-512") == std::string::npos,
      onednn_bf16)
      << r.output;
  r = partrain("run " + cfg.string() + " --set train.precision=f32", dir);
  ASSERT_EQ(r.code, 0) << r.output;
  const double f32 = read_report(dir)["epochs"][0]["train_loss"];
  EXPECT_EQ(r.output.find("note: train.precision"), std::string::npos) << r.output;
  // The convolutions ran in bf16 (8 bits of mantissa): close to f32, not equal.
  EXPECT_NE(bf16, f32);
  EXPECT_NEAR(bf16, f32, 0.05 * f32);
  r = partrain("run " + cfg.string() + " --set train.precision=f16", dir);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("train.precision"), std::string::npos) << r.output;
  if (std::system("nvidia-smi > /dev/null 2>&1") != 0) {
    r = partrain("run " + cfg.string() + " --set train.precision=f16 --set device=auto", dir);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("f16 needs a CUDA device"), std::string::npos) << r.output;
  }
}

}  // namespace
