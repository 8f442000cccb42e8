// data.global_batch_size on whole runs of the built executable: a run stopped mid-epoch at one
// world size and resumed at another ends with the uninterrupted run's losses; the per-rank mode
// still refuses another world size; a global batch the ranks cannot split exits 2 in one line.
#include <cstdint>
#include <cstdlib>

#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

// No BatchNorm (its statistics are per rank, so they would depend on the split); 38 steps of
// 64 samples an epoch, the last one wrapping to the epoch's first samples (2400 = 37.5 x 64); a
// step line every 2 steps. A learning rate at which the runs of 1, 2 and 4 ranks agree to 1e-6
// over both epochs: at higher ones the float rounding of the sums grows apart over the steps.
const char* kGlobalBody = "strategy: ddp\ntrain: {epochs: 2, threads: 1, log_every: 2}\n";

std::vector<std::string> global_args(const fs::path& cfg, int ranks) {
  std::vector<std::string> args = {"run", cfg.string(), "--nproc-per-node", std::to_string(ranks)};
  for (const char* set :
       {"data.batch_size=null", "data.global_batch_size=64", "data.synthetic_train=2400",
        "model.norm=none", "train.optimizer.lr=0.02", "checkpoint.resume=auto"}) {
    args.insert(args.end(), {"--set", set});
  }
  return args;
}

std::string joined(const std::vector<std::string>& args) {
  std::string text;
  for (const auto& a : args) text += (text.empty() ? "" : " ") + a;
  return text;
}

struct EpochFigures {
  std::vector<double> losses;
  std::vector<std::int64_t> images;
  double test_loss = 0;
};

EpochFigures figures(const fs::path& dir) {
  EpochFigures f;
  const Json report = read_report(dir);
  for (const auto& e : report["epochs"]) {
    f.losses.push_back(e["train_loss"].get<double>());
    f.images.push_back(e["images"].get<std::int64_t>());
  }
  f.test_loss = report["final"]["test_loss"].get<double>();
  return f;
}

// The sums over all ranks differ from one world size to another in their rounding only (about
// 1e-6 here); another order of the samples (the per-rank mode's) differs by 6e-4.
void expect_same_training(const EpochFigures& a, const EpochFigures& b) {
  ASSERT_EQ(a.losses.size(), 2u);
  ASSERT_EQ(b.losses.size(), 2u);
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::abs(a.losses[i])) << "epoch " << i + 1;
    EXPECT_EQ(a.images[i], b.images[i]) << "epoch " << i + 1;
  }
  EXPECT_NEAR(a.test_loss, b.test_loss, 1e-5 * std::abs(a.test_loss));
}

// Stops a run of `ranks` ranks with SIGTERM in epoch 2 and checks that it saved that step.
void stop_mid_epoch(const fs::path& dir, const std::vector<std::string>& args,
                    const std::string& shares_rule = "even") {
  const fs::path log = dir / "first.txt";
  // Rank 0 waits 20 ms before each batch, so that the signal lands well inside epoch 2 (the
  // wait changes no number).
  ::setenv("PARTRAIN_TEST_STEP_DELAY", "0:0.02", 1);
  const pid_t launcher = start_partrain({args.begin(), args.end()}, log);
  ::unsetenv("PARTRAIN_TEST_STEP_DELAY");
  ASSERT_TRUE(wait_for_text(log, "epoch 2/2 step 10/", std::chrono::seconds(120)))
      << read_text(log);
  kill(launcher, SIGTERM);
  const auto status = wait_exit(launcher, std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value()) << read_text(log);
  ASSERT_TRUE(WIFEXITED(*status)) << read_text(log);
  ASSERT_EQ(WEXITSTATUS(*status), 75) << read_text(log);  // kExitStopped
  const std::string manifest = read_text(dir / "out" / "checkpoints" / "latest.json");
  ASSERT_NE(manifest.find("epoch-0001.step-"), std::string::npos) << manifest;
  // The checkpoint's meta records the global batch and how it was split.
  const std::string file = Json::parse(manifest)["file"].get<std::string>();
  const std::string bytes = read_text(dir / "out" / "checkpoints" / file);
  EXPECT_NE(bytes.find("\"global_batch_size\":64"), std::string::npos);
  EXPECT_NE(bytes.find("\"shares_rule\":\"" + shares_rule + "\""), std::string::npos);
}

std::vector<std::string> with(std::vector<std::string> args, const std::string& set) {
  args.insert(args.end(), {"--set", set});
  return args;
}

TEST(GlobalBatch, StoppedAtTwoRanksResumedAtOneEndsAsTheUninterruptedRun) {
  auto straight = scratch("global_straight");
  const Result r = partrain(joined(global_args(write_config(straight, kGlobalBody), 2)), straight);
  ASSERT_EQ(r.code, 0) << r.output;
  const EpochFigures expected = figures(straight);
  ASSERT_EQ(expected.images, (std::vector<std::int64_t>{2432, 2432}));  // 38 whole steps
  // The resolved config shows each rank's share beside the global batch.
  const Json report = read_report(straight);
  EXPECT_EQ(report["config"]["data"]["batch_size"], 32);
  EXPECT_EQ(report["config"]["data"]["global_batch_size"], 64);

  auto dir = scratch("global_two_to_one");
  const fs::path cfg = write_config(dir, kGlobalBody);
  ASSERT_NO_FATAL_FAILURE(stop_mid_epoch(dir, global_args(cfg, 2)));
  const std::string saved = read_text(dir / "out" / "checkpoints" / "latest.json");
  EXPECT_NE(read_text(dir / "out" / "checkpoints" / Json::parse(saved)["file"].get<std::string>())
                .find("\"shares\":[32,32]"),
            std::string::npos);
  const Result second = partrain(joined(global_args(cfg, 1)), dir);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("batches into epoch 2"), std::string::npos) << second.output;
  expect_same_training(figures(dir), expected);
  EXPECT_EQ(read_report(dir)["config"]["data"]["batch_size"], 64);

  // And the other way: stopped at one rank, resumed at two.
  auto back = scratch("global_one_to_two");
  const fs::path back_cfg = write_config(back, kGlobalBody);
  ASSERT_NO_FATAL_FAILURE(stop_mid_epoch(back, global_args(back_cfg, 1)));
  const Result resumed = partrain(joined(global_args(back_cfg, 2)), back);
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("batches into epoch 2"), std::string::npos) << resumed.output;
  expect_same_training(figures(back), expected);
}

// One process at the global batch of 64: what every split must train as.
void run_one_process(EpochFigures& out) {
  auto single = scratch("balance_single");
  const Result r = partrain(joined(global_args(write_config(single, kGlobalBody), 1)), single);
  ASSERT_EQ(r.code, 0) << r.output;
  out = figures(single);
}

// data.balance [3, 1]: rank 0 takes 48 of each 64, rank 1 16, and the run trains as one process
// at 64 does; stopped mid-epoch it saves that split, and resumed at one rank it still ends as the
// uninterrupted run.
TEST(GlobalBatch, WeightedSharesTrainAsOneProcessAndResumeElsewhere) {
  EpochFigures expected;
  ASSERT_NO_FATAL_FAILURE(run_one_process(expected));

  auto weighted = scratch("balance_weighted");
  const fs::path cfg = write_config(weighted, kGlobalBody);
  const Result w = partrain(joined(with(global_args(cfg, 2), "data.balance=[3,1]")), weighted);
  ASSERT_EQ(w.code, 0) << w.output;
  expect_same_training(figures(weighted), expected);
  const Json report = read_report(weighted);
  EXPECT_EQ(report["config"]["data"]["batch_size"], 48);  // rank 0's share
  EXPECT_EQ(report["balance"]["mode"], "weights");
  EXPECT_EQ(report["balance"]["shares"], Json::parse("[48, 16]"));
  EXPECT_TRUE(report["balance"]["changes"].empty());

  auto resumed = scratch("balance_weighted_resumed");
  const fs::path resumed_cfg = write_config(resumed, kGlobalBody);
  ASSERT_NO_FATAL_FAILURE(
      stop_mid_epoch(resumed, with(global_args(resumed_cfg, 2), "data.balance=[3,1]"), "weights"));
  const std::string saved = read_text(resumed / "out" / "checkpoints" / "latest.json");
  EXPECT_NE(
      read_text(resumed / "out" / "checkpoints" / Json::parse(saved)["file"].get<std::string>())
          .find("\"shares\":[48,16]"),
      std::string::npos);
  const Result second = partrain(joined(global_args(resumed_cfg, 1)), resumed);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("batches into epoch 2"), std::string::npos) << second.output;
  expect_same_training(figures(resumed), expected);
}

// Uneven shares with the rest of the step. With SyncBatchNorm (the ranks' statistics and
// gradients weighed by their samples) a 3:1 split trains as one process with plain BatchNorm at
// 64, to the 1e-3 that BatchNorm's amplified rounding allows over 76 steps (an even split with
// SyncBatchNorm is 1.4e-4 from it; a backward that adds the ranks' sums unweighed is off by far
// more, trainer's SyncBatchNormUneven test). Accumulated over 2 micro-steps of 32 (24 + 8 each),
// as one process accumulating the same micro-steps.
TEST(GlobalBatch, UnevenSharesWithSyncBatchNormOrAccumulationTrainAsOneProcess) {
  auto train = [](const std::string& name, int ranks, const std::vector<std::string>& sets) {
    auto dir = scratch(name);
    std::vector<std::string> args = global_args(write_config(dir, kGlobalBody), ranks);
    for (const std::string& set : sets) args = with(args, set);
    const Result r = partrain(joined(args), dir);
    EXPECT_EQ(r.code, 0) << r.output;
    return dir;
  };
  const EpochFigures single = figures(train("balance_single_bn", 1, {"model.norm=batch"}));
  const EpochFigures synced =
      figures(train("balance_syncbn", 2,
                    {"model.norm=batch", "model.sync_batchnorm=true", "data.balance=[3,1]"}));
  ASSERT_EQ(synced.losses.size(), single.losses.size());
  for (std::size_t i = 0; i < single.losses.size(); ++i) {
    EXPECT_NEAR(synced.losses[i], single.losses[i], 1e-3 * single.losses[i]) << "epoch " << i + 1;
    EXPECT_EQ(synced.images[i], single.images[i]) << "epoch " << i + 1;
  }
  EXPECT_NEAR(synced.test_loss, single.test_loss, 1e-3 * single.test_loss);

  const EpochFigures one = figures(train("balance_single_acc", 1, {"train.accumulate_steps=2"}));
  const fs::path accumulated =
      train("balance_accumulated", 2, {"train.accumulate_steps=2", "data.balance=[3,1]"});
  EXPECT_EQ(read_report(accumulated)["balance"]["shares"], Json::parse("[24, 8]"));
  expect_same_training(figures(accumulated), one);
}

// data.balance auto with rank 1 slowed (PARTRAIN_TEST_SAMPLE_DELAY: 3 ms a sample in its
// forward): after the warm-up steps the split moves towards rank 0, rank 0 says so, report.json
// records it, and the training is still one process's at 64.
TEST(GlobalBatch, AutoMovesSamplesOffASlowRankAndTrainsAsOneProcess) {
  EpochFigures expected;
  ASSERT_NO_FATAL_FAILURE(run_one_process(expected));

  auto dir = scratch("balance_auto");
  const fs::path cfg = write_config(dir, kGlobalBody);
  ::setenv("PARTRAIN_TEST_SAMPLE_DELAY", "1:0.003", 1);
  const Result a = partrain(joined(with(global_args(cfg, 2), "data.balance=auto")), dir);
  ::unsetenv("PARTRAIN_TEST_SAMPLE_DELAY");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_NE(a.output.find("balance auto: step "), std::string::npos) << a.output;
  expect_same_training(figures(dir), expected);
  const Json balance = read_report(dir)["balance"];
  EXPECT_EQ(balance["mode"], "auto");
  ASSERT_FALSE(balance["changes"].empty()) << balance.dump();
  const Json& first = balance["changes"][0];
  // Measured: rank 1 at least the delay per sample, and slower than rank 0.
  EXPECT_GE(first["seconds_per_sample"][1].get<double>(), 0.003) << first.dump();
  EXPECT_LT(first["seconds_per_sample"][0].get<double>(),
            first["seconds_per_sample"][1].get<double>())
      << first.dump();
  EXPECT_LT(first["predicted_after"].get<double>(), first["predicted_before"].get<double>());
  // Rank 0's steps, measured: at least rank 1's 32 delayed samples each.
  EXPECT_GE(first["step_seconds"].get<double>(), 32 * 0.003) << first.dump();
  const auto shares = balance["shares"].get<std::vector<std::int64_t>>();
  ASSERT_EQ(shares.size(), 2u);
  EXPECT_EQ(shares[0] + shares[1], 64);
  EXPECT_GT(shares[0], shares[1]) << balance.dump();
}

TEST(GlobalBatch, PerRankModeRefusesAnotherWorldSizeNamingTheGlobalBatch) {
  auto dir = scratch("per_rank_other_world");
  const fs::path cfg = write_config(dir, "strategy: ddp\ntrain: {epochs: 1, threads: 1}\n");
  const std::string base = "run " + cfg.string() + " --set checkpoint.resume=auto";
  const Result first = partrain(base + " --nproc-per-node 2", dir);
  ASSERT_EQ(first.code, 0) << first.output;
  const Result second = partrain(base + " --set train.epochs=2 --nproc-per-node 1", dir);
  EXPECT_EQ(second.code, 2) << second.output;
  EXPECT_NE(second.output.find("was written by a run of 2 ranks; this run has 1"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("use data.global_batch_size in both runs to resume at another "
                               "world size"),
            std::string::npos)
      << second.output;
}

TEST(GlobalBatch, AGlobalBatchTheRanksCannotSplitExitsTwoInOneLine) {
  auto dir = scratch("global_bad");
  const fs::path cfg = dir / "global.yaml";
  std::ofstream(cfg) << "name: test\nseed: 1\ndevice: cpu\nstrategy: ddp\n"
                     << "data:\n  dataset: synthetic\n  global_batch_size: 63\n"
                     << "output: {dir: " << (dir / "out").string() << "}\n";
  Result r = partrain("run " + cfg.string() + " --nproc-per-node 2", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.output, "partrain: " + cfg.string() +
                          ":7:22: data.global_batch_size: 63 samples per step do not split "
                          "evenly over 2 ranks; use a multiple of 2\n")
      << r.output;
  // At one rank it fits; accumulated over 2 micro-steps it does not.
  r = partrain("run " + cfg.string() + " --nproc-per-node 1 --set train.accumulate_steps=2", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find(":7:22: data.global_batch_size: 63 samples do not split into 2 equal "
                          "micro-steps"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  // Weights that do not fit the ranks: one line naming the key, where it is, and the numbers.
  r = partrain(
      "run " + cfg.string() +
          " --nproc-per-node 2 --set data.global_batch_size=64 --set 'data.balance=[3, 2, 1]'",
      dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.output,
            "partrain: --set data.balance=[3, 2, 1]: data.balance: 3 weights for 2 ranks; "
            "give one per rank\n")
      << r.output;
  r = partrain(
      "run " + cfg.string() +
          " --nproc-per-node 2 --set data.global_batch_size=8 --set 'data.balance=[100, 1]'",
      dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.output,
            "partrain: --set data.balance=[100, 1]: data.balance: rank 1's share of 8 "
            "samples per micro-step rounds to 0 (weights 100,1); every rank needs at "
            "least 1 sample\n")
      << r.output;
  r = partrain(
      "run " + cfg.string() + " --set data.global_batch_size=64 --set 'data.balance=[2, 0]'", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("data.balance: rank 1's weight is 0; every weight must be > 0"),
            std::string::npos)
      << r.output;
  // Both batch keys: refused.
  r = partrain("run " + cfg.string() + " --set data.batch_size=16", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("data.global_batch_size: given with data.batch_size"), std::string::npos)
      << r.output;
}

}  // namespace
