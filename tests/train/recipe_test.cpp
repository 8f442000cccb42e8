// The training recipe's parts, in one process: learning-rate schedules at given steps, label
// smoothing against its formula, top-5 counting, the loss scaler's rules, and an f16 step whose
// gradients overflow on one of two ranks (threads over a real communicator): both ranks skip
// it, keep their parameters and halve the scale, then train on together. And the BatchNorm
// statistics the ranks share before evaluation: rank 0's with even shares, the ranks' mean
// weighed by their shares with uneven ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "trainer/loop/evaluation.h"
#include "trainer/precision/precision.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/parallel/strategy.h"
#include "trainer/loop/train_step.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

// A scratch folder for a file store, removed at the end of the test.
struct StoreDir {
  fs::path path =
      fs::temp_directory_path() / ("partrain_recipe_test_" + std::to_string(::getpid()));
  StoreDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~StoreDir() { fs::remove_all(path); }
};

// Strategy ddp over a small DigitalNet, and a copy of its model for each of 2 ranks, drawn in
// turn from LibTorch's one generator (the same weights for both).
Config small_ddp(Norm norm) {
  Config cfg;
  cfg.strategy = StrategyKind::kDdp;
  cfg.model.name = ModelName::kDigitalNet;
  cfg.model.width = 4;
  cfg.model.norm = norm;
  return cfg;
}

std::vector<std::unique_ptr<TrainModel>> two_models(const Config& cfg) {
  std::vector<std::unique_ptr<TrainModel>> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(5);
    models.push_back(make_train_model(cfg.model, ModelShape{3, 16, 10}));
  }
  return models;
}

// Rank `rank` of 2 over an asio-ring communicator whose store lives in `dir`.
struct PairRank {
  std::unique_ptr<comm::Store> store;
  std::unique_ptr<comm::Communicator> comm;
  PairRank(const fs::path& dir, int rank) {
    comm::StoreOptions so;
    so.token = "recipe-test";
    so.timeout = std::chrono::seconds(30);
    so.rank = rank;
    so.world_size = 2;
    store = comm::open_store("file://" + dir.string(), so);
    comm::CommOptions co;
    co.backend = "asio-ring";
    co.timeout = std::chrono::seconds(30);
    co.token = so.token;
    comm = comm::make_communicator(co, *store, rank, 2);
  }
};

ScheduleConfig schedule(ScheduleName name, std::int64_t warmup) {
  ScheduleConfig s;
  s.name = name;
  s.warmup_steps = warmup;
  return s;
}

TEST(LrSchedule, ConstantWithWarmupRampsLinearlyToTheRate) {
  LrSchedule lr(schedule(ScheduleName::kConstant, 4), 0.8, 100);
  EXPECT_DOUBLE_EQ(lr.lr_at(0), 0.2);
  EXPECT_DOUBLE_EQ(lr.lr_at(1), 0.4);
  EXPECT_DOUBLE_EQ(lr.lr_at(3), 0.8);
  EXPECT_DOUBLE_EQ(lr.lr_at(4), 0.8);
  EXPECT_DOUBLE_EQ(lr.lr_at(99), 0.8);
  LrSchedule none(schedule(ScheduleName::kConstant, 0), 0.8, 100);
  EXPECT_DOUBLE_EQ(none.lr_at(0), 0.8);
}

TEST(LrSchedule, StepDecaysByGammaEveryStepSizeAfterWarmup) {
  ScheduleConfig s = schedule(ScheduleName::kStep, 2);
  s.step_size = 3;
  s.gamma = 0.5;
  LrSchedule lr(s, 1.0, 100);
  EXPECT_DOUBLE_EQ(lr.lr_at(0), 0.5);  // warmup
  EXPECT_DOUBLE_EQ(lr.lr_at(1), 1.0);
  EXPECT_DOUBLE_EQ(lr.lr_at(2), 1.0);  // steps 2, 3, 4: no decay yet
  EXPECT_DOUBLE_EQ(lr.lr_at(4), 1.0);
  EXPECT_DOUBLE_EQ(lr.lr_at(5), 0.5);
  EXPECT_DOUBLE_EQ(lr.lr_at(7), 0.5);
  EXPECT_DOUBLE_EQ(lr.lr_at(8), 0.25);
}

TEST(LrSchedule, CosineFallsFromTheRateToMinLrAtTheLastStep) {
  ScheduleConfig s = schedule(ScheduleName::kCosine, 10);
  s.min_lr = 0.1;
  const std::int64_t total = 110;
  LrSchedule lr(s, 1.1, total);
  EXPECT_DOUBLE_EQ(lr.lr_at(0), 0.11);
  EXPECT_DOUBLE_EQ(lr.lr_at(9), 1.1);
  // p = (s - W + 1) / (T - W): a quarter, half and all of the decay.
  EXPECT_NEAR(lr.lr_at(34), 0.1 + 1.0 * (1 + std::cos(M_PI * 0.25)) / 2, 1e-12);
  EXPECT_NEAR(lr.lr_at(59), 0.6, 1e-12);
  EXPECT_NEAR(lr.lr_at(total - 1), 0.1, 1e-12);
  EXPECT_NEAR(lr.lr_at(total + 5), 0.1, 1e-12);  // past the end: stays at min_lr
  for (std::int64_t step = 10; step < total - 1; ++step)
    EXPECT_GT(lr.lr_at(step), lr.lr_at(step + 1));
}

TEST(LrSchedule, TotalStepsCountsAccumulationAndMaxSteps) {
  TrainConfig t;
  t.epochs = 3;
  t.accumulate_steps = 4;
  EXPECT_EQ(total_optimizer_steps(t, 10), 9);  // ceil(10 / 4) = 3 steps per epoch
  t.max_steps = 5;
  EXPECT_EQ(total_optimizer_steps(t, 10), 5);
}

TEST(ClassificationLoss, LabelSmoothingIsTheFormula) {
  torch::manual_seed(3);
  const auto logits = torch::randn({6, 5}, torch::kFloat64) * 3;
  const auto labels = torch::tensor({0, 4, 2, 2, 1, 3}, torch::kLong);
  const double e = 0.2;
  const auto logp = torch::log_softmax(logits, 1);
  // (1 - e) * cross-entropy + e * mean over classes of -log p.
  const double nll = -logp.gather(1, labels.unsqueeze(1)).mean().item<double>();
  const double uniform = -logp.mean(1).mean().item<double>();
  const double expected = (1 - e) * nll + e * uniform;
  EXPECT_NEAR(classification_loss(logits, labels, e).item<double>(), expected, 1e-5);
  EXPECT_NEAR(classification_loss(logits, labels, 0.0).item<double>(), nll, 1e-5);
  EXPECT_GT(std::abs(expected - nll), 1e-2);  // the two differ here, so the check means something
}

TEST(TopK, CountsTheLabelAmongTheLargestLogits) {
  // Row 0: label has the largest logit; row 1: the 3rd largest; row 2: the 6th (of 7).
  const auto logits = torch::tensor(
      {{9., 1., 2., 3., 4., 5., 6.}, {9., 8., 7., 1., 2., 3., 0.}, {6., 5., 4., 3., 2., 1., 0.}});
  const auto labels = torch::tensor({0, 2, 5}, torch::kLong);
  EXPECT_EQ(top_k_correct(logits, labels, 1), 1);
  EXPECT_EQ(top_k_correct(logits, labels, 3), 2);
  EXPECT_EQ(top_k_correct(logits, labels, 5), 2);
  EXPECT_EQ(top_k_correct(logits, labels, 6), 3);
  // Fewer classes than k: every row counts.
  EXPECT_EQ(top_k_correct(logits.narrow(1, 0, 3), torch::tensor({0, 2, 1}, torch::kLong), 5), 3);
}

TEST(LossScaler, GrowsAfterTheIntervalAndBacksOffOnOverflow) {
  LossScalerOptions o;
  o.growth_interval = 3;
  PrecisionPlugin s(Precision::kF32, /*loss_scaling=*/true, torch::kCPU, o);
  EXPECT_DOUBLE_EQ(s.state()->scale, 65536.0);
  s.update(true);
  s.update(true);
  EXPECT_DOUBLE_EQ(s.state()->scale, 65536.0);
  s.update(true);
  EXPECT_DOUBLE_EQ(s.state()->scale, 131072.0);
  EXPECT_EQ(s.state()->good_steps, 0);
  s.update(true);
  s.update(false);
  EXPECT_DOUBLE_EQ(s.state()->scale, 65536.0);
  EXPECT_EQ(s.state()->good_steps, 0);
  EXPECT_DOUBLE_EQ(s.scale_loss(torch::ones({})).item<double>(), 65536.0);
  PrecisionPlugin off(Precision::kF32, /*loss_scaling=*/false, torch::kCPU);
  EXPECT_DOUBLE_EQ(off.scale_loss(torch::ones({})).item<double>(), 1.0);
  EXPECT_FALSE(off.state().has_value());
}

// train.precision picks both parts at once; f16 cannot run on the CPU and says so.
TEST(PrecisionPlugin, ForTrainingTiesAutocastAndTheLossScale) {
  const auto bf16 = PrecisionPlugin::for_training(Precision::kBf16, torch::kCPU);
  EXPECT_EQ(bf16.autocast(), Precision::kBf16);
  EXPECT_FALSE(bf16.loss_scaling());
  EXPECT_FALSE(PrecisionPlugin::for_training(Precision::kF32, torch::kCPU).loss_scaling());
  EXPECT_THROW(PrecisionPlugin::for_training(Precision::kF16, torch::kCPU), UsageError);
}

// Two ranks over asio-ring, each with its own model copy and a TrainStep with loss scaling.
// Rank 1's first batch holds an inf, so its gradients, and the average, are not finite.
TEST(LossScaler, AnOverflowOnOneRankSkipsTheStepOnBoth) {
  const StoreDir dir;
  // No BatchNorm: it would carry the inf into its running statistics.
  Config cfg = small_ddp(Norm::kNone);
  cfg.train.optimizer.lr = 0.1;
  std::vector<std::unique_ptr<TrainModel>> models = two_models(cfg);
  struct Seen {
    std::vector<torch::Tensor> before, after_skip, after_step;
    LossScalerState after_skip_state, after_step_state;
    std::int64_t skipped = 0;
  };
  Seen seen[2];
  auto rank_main = [&](int rank) {
    PairRank pair(dir.path, rank);
    comm::Communicator* comm = pair.comm.get();
    TrainModel& model = *models[rank];
    std::unique_ptr<Strategy> strategy = make_strategy(cfg, torch::kCPU, comm);
    strategy->make_optimizer(model);
    strategy->start_gradient_averaging(model);
    TrainStep step(TrainStepOptions{},
                   PrecisionPlugin(Precision::kF32, /*loss_scaling=*/true, torch::kCPU), *strategy,
                   LrSchedule(ScheduleConfig{}, 0.1, 10));
    auto snapshot = [&] {
      std::vector<torch::Tensor> copy;
      for (const auto& p : model.module().parameters()) copy.push_back(p.detach().clone());
      return copy;
    };
    auto gen = at::detail::createCPUGenerator(100 + rank);
    auto images = at::randn({4, 3, 16, 16}, gen);
    auto labels = at::randint(0, 10, {4}, gen);
    seen[rank].before = snapshot();
    auto poisoned = images.clone();
    if (rank == 1) poisoned[0][0][0][0] = std::numeric_limits<float>::infinity();
    step.run(model, poisoned, labels, /*sync=*/true, 1, /*step=*/0);
    seen[rank].after_skip = snapshot();
    seen[rank].after_skip_state = *step.precision().state();
    seen[rank].skipped = step.skipped_steps();
    step.run(model, images, labels, true, 1, 1);
    seen[rank].after_step = snapshot();
    seen[rank].after_step_state = *step.precision().state();
    strategy->stop();
    comm->barrier();
  };
  testing::run_ranks(2, rank_main);

  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(seen[r].skipped, 1);
    EXPECT_DOUBLE_EQ(seen[r].after_skip_state.scale, 32768.0);
    ASSERT_EQ(seen[r].before.size(), seen[r].after_skip.size());
    for (std::size_t i = 0; i < seen[r].before.size(); ++i) {
      EXPECT_TRUE(torch::equal(seen[r].before[i], seen[r].after_skip[i])) << "parameter " << i;
    }
    // The next, finite step is taken: the parameters move, the scale stays.
    EXPECT_DOUBLE_EQ(seen[r].after_step_state.scale, 32768.0);
    EXPECT_EQ(seen[r].after_step_state.good_steps, 1);
    EXPECT_FALSE(torch::equal(seen[r].before[0], seen[r].after_step[0]));
    for (const auto& p : seen[r].after_step) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  }
  for (std::size_t i = 0; i < seen[0].after_step.size(); ++i) {
    EXPECT_TRUE(torch::equal(seen[0].after_step[i], seen[1].after_step[i])) << "parameter " << i;
  }
}

// Rank 0's running statistics are 1 and rank 1's 5 (counters 3 and 7). Shares 3:1 of 4 give
// 0.75 x 1 + 0.25 x 5 = 2 everywhere, and leave each rank's counter as it is; even shares give
// rank 0's, counter too.
TEST(Strategy, SharedBatchNormStatisticsWeighTheRanksByTheirShares) {
  const StoreDir dir;
  const Config cfg = small_ddp(Norm::kBatch);
  std::vector<std::unique_ptr<TrainModel>> models = two_models(cfg);
  struct Seen {
    float uneven_mean = 0, uneven_var = 0, even_mean = 0;
    std::int64_t uneven_count = 0, even_count = 0;
  };
  Seen seen[2];
  auto rank_main = [&](int rank) {
    PairRank pair(dir.path, rank);
    TrainModel& model = *models[rank];
    auto fill = [&] {
      torch::NoGradGuard no_grad;
      for (auto& b : model.module().named_buffers()) {
        if (b.key().find("num_batches_tracked") != std::string::npos) {
          b.value().fill_(rank == 0 ? 3 : 7);
        } else {
          b.value().fill_(rank == 0 ? 1.0 : 5.0);
        }
      }
    };
    auto read = [&](const std::string& suffix) {
      for (auto& b : model.module().named_buffers()) {
        const std::string& key = b.key();
        if (key.size() >= suffix.size() &&
            key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
          return b.value();
        }
      }
      return torch::Tensor();
    };
    std::unique_ptr<Strategy> strategy = make_strategy(cfg, torch::kCPU, pair.comm.get());
    fill();
    strategy->set_rank_share(rank == 0 ? 3 : 1, 4);
    strategy->share_buffers(model);
    seen[rank].uneven_mean = read("running_mean").max().item<float>();
    seen[rank].uneven_var = read("running_var").min().item<float>();
    seen[rank].uneven_count = read("num_batches_tracked").item<std::int64_t>();
    fill();
    strategy->set_rank_share(2, 4);
    strategy->share_buffers(model);
    seen[rank].even_mean = read("running_mean").max().item<float>();
    seen[rank].even_count = read("num_batches_tracked").item<std::int64_t>();
    pair.comm->barrier();
  };
  testing::run_ranks(2, rank_main);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_FLOAT_EQ(seen[r].uneven_mean, 2.0f);
    EXPECT_FLOAT_EQ(seen[r].uneven_var, 2.0f);
    EXPECT_EQ(seen[r].uneven_count, r == 0 ? 3 : 7);
    EXPECT_FLOAT_EQ(seen[r].even_mean, 1.0f);
    EXPECT_EQ(seen[r].even_count, 3);
  }
}

}  // namespace
}  // namespace partrain
