// train.shard optimizer and gradients against unsharded DDP, in one process with ranks as
// threads over a real communicator: the same data, the same model, and every update's parts
// that sharding touches — SGD with momentum and AdamW, clipping to a global norm, gradient
// accumulation, the f16 loss scale's verdict (scaling on the CPU), uneven shares, buckets that
// split parameters between ranks and need padding — end with the same parameters to float
// tolerance, the same on every rank. And a sharded strategy's checkpoint state read back at
// another world size, sharded or not, gives the same optimizer state.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "trainer/loop/pickle_file.h"
#include "trainer/loop/train_step.h"
#include "trainer/optim/optimizer_state.h"
#include "trainer/parallel/strategy.h"
#include "trainer/parallel/strategy_state.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

constexpr int kBatch = 4;  // per rank and micro-step
constexpr int kSteps = 3;

struct ShardCase {
  std::string backend = "asio-ring";
  int world = 2;
  OptimizerName optimizer = OptimizerName::kAdamW;
  int accumulate = 1;
  double clip = 0;
  bool loss_scaling = false;
  bool uneven = false;  // rank r takes r + 1 parts of each micro-step
};

std::string name_of(const ShardCase& c) {
  std::string n = c.backend + "_w" + std::to_string(c.world) + "_" +
                  std::string(partrain::name_of(c.optimizer));
  if (c.accumulate > 1) n += "_acc" + std::to_string(c.accumulate);
  if (c.clip > 0) n += "_clip";
  if (c.loss_scaling) n += "_scaled";
  if (c.uneven) n += "_uneven";
  for (auto& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

Config config_of(const ShardCase& c, Shard shard) {
  Config cfg;
  cfg.strategy = StrategyKind::kDdp;
  cfg.seed = 3;
  cfg.model.name = ModelName::kDigitalNet;
  cfg.model.width = 4;
  cfg.model.norm = Norm::kNone;  // BatchNorm's statistics depend on the batch split
  cfg.comm.bucket_mb = 0.004;    // ~1000 floats: many buckets, parameters cut by blocks
  cfg.comm.timeout_s = 30;
  cfg.train.optimizer.name = c.optimizer;
  cfg.train.optimizer.lr = c.optimizer == OptimizerName::kAdamW ? 0.01 : 0.1;
  cfg.train.optimizer.weight_decay = c.optimizer == OptimizerName::kAdamW ? 0.01 : 5e-4;
  cfg.train.clip_grad_norm = c.clip;
  cfg.train.shard = shard;
  return cfg;
}

// A scratch folder for the file store of one world.
struct StoreDir {
  fs::path path;
  explicit StoreDir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("partrain_shard_test_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~StoreDir() { fs::remove_all(path); }
};

struct RankComm {
  std::unique_ptr<comm::Store> store;
  std::unique_ptr<comm::Communicator> comm;
  RankComm(const fs::path& dir, const std::string& backend, int rank, int world) {
    comm::StoreOptions so;
    so.token = "shard-test";
    so.timeout = std::chrono::seconds(30);
    so.rank = rank;
    so.world_size = world;
    store = comm::open_store("file://" + dir.string(), so);
    comm::CommOptions co;
    co.backend = backend;
    co.timeout = std::chrono::seconds(30);
    co.token = so.token;
    comm = comm::make_communicator(co, *store, rank, world);
  }
};

// Each rank's model, drawn in turn from LibTorch's one generator (the same weights for all).
std::vector<std::unique_ptr<TrainModel>> models_of(const Config& cfg, int world) {
  std::vector<std::unique_ptr<TrainModel>> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(7);
    models.push_back(make_train_model(cfg.model, ModelShape{3, 16, 10}));
  }
  return models;
}

struct Trained {
  std::vector<std::vector<torch::Tensor>> parameters;  // per rank
  std::int64_t skipped = 0;                            // rank 0's skipped steps
  std::vector<StrategyState> states;                   // per rank, after the last step
};

// kSteps optimizer steps of `world` ranks; a micro-step's samples are split over the ranks
// evenly or (uneven) r + 1 parts to rank r. With loss scaling, step 1's samples hold an inf on
// the last rank, so every rank must skip that step (on every micro-step's data: with sharded
// gradients each micro-step's gradients are reduced on their own).
Trained train(const ShardCase& c, Shard shard, const std::string& tag) {
  const Config cfg = config_of(c, shard);
  const StoreDir dir(name_of(c) + "_" + tag);
  auto models = models_of(cfg, c.world);
  Trained out;
  out.parameters.resize(c.world);
  out.states.resize(c.world);
  const int parts = c.uneven ? c.world * (c.world + 1) / 2 : c.world;
  const int micro = parts * kBatch;  // samples per micro-step over all ranks
  testing::run_ranks(c.world, [&](int rank) {
    RankComm rc(dir.path, c.backend, rank, c.world);
    TrainModel& model = *models[rank];
    std::unique_ptr<Strategy> strategy = make_strategy(cfg, torch::kCPU, rc.comm.get());
    strategy->make_optimizer(model);
    strategy->start_gradient_averaging(model);
    const int share = (c.uneven ? rank + 1 : 1) * kBatch;
    const int offset = (c.uneven ? rank * (rank + 1) / 2 : rank) * kBatch;
    strategy->set_rank_share(share, micro);
    TrainStep step(train_step_options(cfg.train),
                   PrecisionPlugin(Precision::kF32, c.loss_scaling, torch::kCPU), *strategy,
                   LrSchedule(cfg.train.schedule, cfg.train.optimizer.lr, kSteps));
    for (int s = 0; s < kSteps; ++s) {
      for (int m = 0; m < c.accumulate; ++m) {
        auto gen = at::detail::createCPUGenerator(100 * s + m);
        auto x = at::randn({micro, 3, 16, 16}, gen);
        auto y = at::randint(0, 10, {micro}, gen);
        // An inf in step 1's samples of the last rank: its gradients, and their sum, are not
        // finite.
        if (c.loss_scaling && s == 1 && rank == c.world - 1) {
          x.narrow(0, offset, 1).fill_(std::numeric_limits<float>::infinity());
        }
        step.run(model, x.narrow(0, offset, share), y.narrow(0, offset, share),
                 m + 1 == c.accumulate, c.accumulate, s);
      }
    }
    for (const auto& p : model.module().parameters()) {
      out.parameters[rank].push_back(p.detach().clone());
    }
    if (rank == 0) out.skipped = step.skipped_steps();
    strategy->save_state(out.states[rank], true);
    strategy->stop();
    rc.comm->barrier();
  });
  return out;
}

void expect_same_training(const Trained& sharded, const Trained& plain, double tolerance) {
  ASSERT_EQ(sharded.parameters[0].size(), plain.parameters[0].size());
  EXPECT_EQ(sharded.skipped, plain.skipped);
  for (std::size_t r = 0; r < sharded.parameters.size(); ++r) {
    for (std::size_t i = 0; i < plain.parameters[0].size(); ++i) {
      const double diff =
          (sharded.parameters[r][i] - plain.parameters[0][i]).abs().max().item<double>();
      EXPECT_LT(diff, tolerance) << "rank " << r << " parameter " << i;
      // Every rank ends with the same parameters: the allgather put each block everywhere.
      EXPECT_TRUE(torch::equal(sharded.parameters[r][i], sharded.parameters[0][i]))
          << "rank " << r << " parameter " << i;
    }
  }
}

class ShardedEqualsDdp : public ::testing::TestWithParam<ShardCase> {};

TEST_P(ShardedEqualsDdp, OptimizerAndGradientShardsTrainAsUnsharded) {
  const ShardCase c = GetParam();
  if (!comm::backend_compiled_in(c.backend)) GTEST_SKIP() << c.backend << " is not compiled in";
  torch::set_num_threads(1);
  const Trained plain = train(c, Shard::kNone, "none");
  if (c.loss_scaling) {
    EXPECT_EQ(plain.skipped, 1);  // the case does what it says
  }
  for (Shard shard : {Shard::kOptimizer, Shard::kGradients}) {
    SCOPED_TRACE(std::string("train.shard ") + std::string(partrain::name_of(shard)));
    expect_same_training(train(c, shard, std::string(partrain::name_of(shard))), plain, 2e-5);
  }
}

std::vector<ShardCase> shard_cases() {
  std::vector<ShardCase> out;
  std::vector<std::string> backends = {"asio-ring", "shm"};
  if (comm::backend_compiled_in("gloo")) backends.push_back("gloo");
  for (const auto& b : backends) {
    out.push_back({b, 2, OptimizerName::kAdamW});
    out.push_back({b, 3, OptimizerName::kSgd});  // blocks of a third: padding
  }
  out.push_back({"asio-ring", 2, OptimizerName::kSgd, 2, 0.05});          // accumulation, clipping
  out.push_back({"asio-ring", 3, OptimizerName::kAdamW, 1, 0.05, true});  // f16's skip, clipping
  out.push_back({"asio-ring", 3, OptimizerName::kAdamW, 2, 0, false, true});  // uneven shares
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, ShardedEqualsDdp, ::testing::ValuesIn(shard_cases()),
                         [](const auto& info) { return name_of(info.param); });

// The optimizer state of a sharded world, each rank's shard, read back by worlds of another size,
// sharded and not: every rank of each ends up holding the unsharded run's state (for its slice).
TEST(ShardedState, ShardsOfOneWorldLoadIntoAnotherSizedOneShardedOrNot) {
  torch::set_num_threads(1);
  ShardCase c;
  c.world = 2;
  const Trained plain = train(c, Shard::kNone, "state_none");
  const Trained sharded = train(c, Shard::kGradients, "state_sharded");
  ASSERT_TRUE(sharded.states[0].shard.has_value());
  // The whole state per parameter name, as the unsharded run saved it.
  std::map<std::string, at::Tensor> expected;
  for (const auto& [key, value] : plain.states[0].entries) {
    if (key != "optimizer") continue;
    for (const auto& item : value.toGenericDict().at("state").toGenericDict()) {
      expected[item.key().toStringRef()] =
          item.value().toGenericDict().at("exp_avg").toTensor().reshape(-1);
    }
  }
  ASSERT_FALSE(expected.empty());
  c10::IValue entry;
  for (const auto& [key, value] : sharded.states[0].entries) {
    if (key == "optimizer") entry = value;
  }
  for (const auto& [world, shard] :
       std::vector<std::pair<int, Shard>>{{3, Shard::kOptimizer}, {1, Shard::kNone}}) {
    SCOPED_TRACE("resumed by " + std::to_string(world) + " ranks, train.shard " +
                 std::string(partrain::name_of(shard)));
    ShardCase resumed = c;
    resumed.world = world;
    const Config cfg = config_of(resumed, shard);
    const StoreDir dir("state_load_" + std::to_string(world));
    auto models = models_of(cfg, world);
    std::vector<std::map<std::string, at::Tensor>> seen(world);
    testing::run_ranks(world, [&](int rank) {
      RankComm rc(dir.path, c.backend, rank, world);
      std::unique_ptr<Strategy> strategy = make_strategy(cfg, torch::kCPU, rc.comm.get());
      strategy->make_optimizer(*models[rank]);
      SavedStrategyState saved;
      saved.path = "the test's shards";
      saved.checkpoint.insert("optimizer", entry);
      saved.shards = 2;
      saved.read_shard = [&](int s) { return *sharded.states[s].shard; };
      strategy->load_state(saved);
      // What this rank now holds, seen through its own save: whole, or its shard's pieces.
      StrategyState now;
      strategy->save_state(now, true);
      std::vector<std::pair<std::string, c10::IValue>> entries = now.entries;
      SavedStrategyState again;
      again.path = "the reload";
      for (const auto& [key, value] : entries) again.checkpoint.insert(key, value);
      if (now.shard) {
        again.shards = 1;
        const c10::IValue own = *now.shard;
        again.read_shard = [own](int) { return own; };
      }
      const SavedOptimizerState state = saved_optimizer(again);
      state.for_each_piece([&](const StatePiece& piece) {
        for (const auto& [key, t] : piece.tensors) {
          if (key != "exp_avg") continue;
          at::Tensor& whole = seen[rank][piece.name];
          if (!whole.defined()) whole = at::full({expected.at(piece.name).numel()}, NAN);
          whole.narrow(0, piece.begin, piece.end - piece.begin).copy_(t);
        }
      });
      strategy->stop();
      rc.comm->barrier();
    });
    // Between them the ranks hold every element, each the unsharded run's value.
    for (const auto& [name, want] : expected) {
      at::Tensor got = at::full({want.numel()}, NAN);
      for (int r = 0; r < world; ++r) {
        auto it = seen[r].find(name);
        if (it == seen[r].end()) continue;
        const at::Tensor mask = it->second.isnan().logical_not();
        got.masked_scatter_(mask, it->second.masked_select(mask));
      }
      EXPECT_FALSE(got.isnan().any().item<bool>()) << name << " not held by any rank";
      EXPECT_LT((got - want).abs().max().item<double>(), 2e-5) << name;
    }
  }
}

// A checkpoint's shard count must be a whole number of at least 1 (a negative one resumed
// without any optimizer state); LibTorch's errors while its values are read, and a dict that
// lacks a key, name the file; running out of device memory is left as it is.
TEST(ShardedState, ShardCountsAndReadingErrorsNameTheCheckpoint) {
  auto entry = [](const c10::IValue& shards) {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    dict.insert("name", std::string("adamw"));
    dict.insert("shards", shards);
    return c10::IValue(dict);
  };
  auto refusal = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_EQ(SavedOptimizerState::shards_of(c10::IValue(std::string("x")), "c.pt"), 0);
  EXPECT_EQ(SavedOptimizerState::shards_of(entry(std::int64_t{3}), "c.pt"), 3);
  EXPECT_EQ(refusal([&] { SavedOptimizerState::shards_of(entry(std::int64_t{-2}), "c.pt"); }),
            "checkpoint c.pt: its optimizer state's shard count is -2, not a whole number of 1 "
            "or more");
  EXPECT_EQ(refusal([&] { SavedOptimizerState::shards_of(entry(1.5), "c.pt"); }),
            "checkpoint c.pt: its optimizer state's shard count is Double, not a whole number "
            "of 1 or more");
  EXPECT_NE(refusal([&] { SavedOptimizerState::shards_of(entry(std::int64_t{1} << 40), "c.pt"); }),
            "(accepted)");

  EXPECT_EQ(refusal([] { reading_checkpoint("c.pt", [] { throw std::out_of_range("k"); }); }),
            "checkpoint c.pt cannot be loaded: an entry lacks a key (k)");
  const std::string wrong_type =
      refusal([] { reading_checkpoint("c.pt", [] { c10::IValue(std::string("s")).toTensor(); }); });
  EXPECT_EQ(wrong_type.rfind("checkpoint c.pt cannot be loaded: ", 0), 0u) << wrong_type;
  EXPECT_EQ(wrong_type.find('\n'), std::string::npos) << wrong_type;
  EXPECT_THROW(reading_checkpoint(
                   "c.pt",
                   [] {
                     throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "out of memory");
                   }),
               c10::OutOfMemoryError);
}

}  // namespace
}  // namespace partrain
