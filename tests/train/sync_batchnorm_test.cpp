// SyncBatchNorm's defining property, with ranks as threads: W ranks at batch b, their
// DigitalNet's BatchNorm layers converted to SyncBatchNorm, compute what one process computes
// at batch W*b with plain BatchNorm — step by step the same outputs (each rank its rows),
// the same gradients once the Reducer has averaged them, and in the end the same running
// statistics and parameters. The Reducer runs on its own communicator at the same time as the
// layers' allreduces, as in a real run. Also: plain BatchNorm across ranks does NOT give this
// (so the comparison can fail), and eval mode needs no communication. With uneven shares of the
// batch (data.balance), each rank's gradient counted by its share, the same holds.
#include "trainer/parallel/sync_batchnorm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <numeric>
#include <tuple>
#include <thread>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "trainer/model/models.h"
#include "trainer/parallel/reducer.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

constexpr int kBatch = 5;  // per rank
constexpr int kSteps = 3;

torch::nn::Sequential make_net(ModelName model = ModelName::kDigitalNet,
                               const NormLayer& norm = nullptr) {
  ModelConfig c;
  c.name = model;
  c.width = 4;
  c.norm = Norm::kBatch;
  torch::manual_seed(3);
  return make_model(c, ModelShape{3, 16, 10}, norm);
}

std::pair<torch::Tensor, torch::Tensor> step_data(int step, int total) {
  auto gen = at::detail::createCPUGenerator(500 + step);
  // Away from mean 0 / variance 1, so that wrong statistics show.
  auto x = at::randn({total, 3, 16, 16}, gen) * 2 + 0.5;
  auto y = at::randint(0, 10, {total}, gen);
  return {x, y};
}

// What one run records: per step the outputs (this rank's rows) and the averaged gradients,
// and at the end the parameters and buffers.
struct Trace {
  std::vector<torch::Tensor> outputs;
  std::vector<std::vector<torch::Tensor>> gradients;
  std::vector<torch::Tensor> parameters;
  std::vector<torch::Tensor> buffers;
};

// rank < 0: one process, the whole batch of `world` ranks.
// The precision a model's comparison runs in. resnet18's twenty BatchNorm layers, the last on
// 2x2 maps, amplify f32 rounding over three steps at lr 0.1 (1e-6 after the first, 5-20 %
// after the third, with or without SyncBatchNorm); in f64 the runs agree to 4e-7, so the
// comparison there tests the layers, not the rounding.
torch::Dtype dtype_for(ModelName model) {
  return model == ModelName::kResnet18 ? torch::kDouble : torch::kFloat;
}

// Each rank's rows of a step: `shares` (empty: kBatch each).
std::vector<int> rank_shares(int world, std::vector<int> shares) {
  if (shares.empty()) shares.assign(static_cast<std::size_t>(world), kBatch);
  return shares;
}

void train(torch::nn::Sequential& net, const std::vector<int>& shares, int rank, Reducer* reducer,
           Trace& trace, torch::Dtype dtype = torch::kFloat) {
  net->to(dtype);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  int total = 0, first = 0;
  for (int r = 0; r < static_cast<int>(shares.size()); ++r) {
    if (r < rank) first += shares[r];
    total += shares[r];
  }
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = step_data(s, total);
    if (rank >= 0) {
      x = x.narrow(0, first, shares[rank]);
      y = y.narrow(0, first, shares[rank]);
    }
    auto out = net->forward(x.to(dtype));
    trace.outputs.push_back(out.detach().clone());
    if (reducer) reducer->prepare_for_backward(true);
    torch::nn::functional::cross_entropy(out, y).backward();
    if (reducer) reducer->finish_backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    trace.gradients.push_back(grads);
    opt.step();
    opt.zero_grad();
  }
  for (const auto& p : net->parameters()) trace.parameters.push_back(p.detach().clone());
  for (const auto& b : net->buffers()) trace.buffers.push_back(b.clone());
}

// Each rank: a communicator for the Reducer and one for the BatchNorm layers, over one store.
// The communicators are made in threads (they rendezvous), the models then in this thread
// (the global generator seeds them), and the ranks train in threads again.
std::vector<Trace> train_ranks(const std::string& backend, ModelName model, int world, bool sync,
                               std::vector<int> shares = {}) {
  shares = rank_shares(world, shares);
  const int total = std::accumulate(shares.begin(), shares.end(), 0);
  const std::string dir = (fs::temp_directory_path() /
                           ("partrain_syncbn_" + std::to_string(::getpid()) + "_" + backend + "_" +
                            std::string(name_of(model)) + "_" + std::to_string(sync)))
                              .string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::unique_ptr<comm::Store>> stores(world);
  std::vector<std::unique_ptr<comm::Communicator>> comms(world), bn_comms(world);
  std::vector<std::string> errors(world);
  auto in_ranks = [&](const std::function<void(int)>& work) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        try {
          work(r);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  };
  in_ranks([&](int r) {
    comm::StoreOptions so;
    so.token = "syncbn-test";
    so.timeout = std::chrono::seconds(30);
    so.rank = r;
    so.world_size = world;
    stores[r] = comm::open_store("file://" + dir, so);
    comm::CommOptions co;
    co.backend = backend;
    co.timeout = std::chrono::seconds(30);
    co.token = so.token;
    comms[r] = comm::make_communicator(co, *stores[r], r, world);
    bn_comms[r] = comm::make_communicator(co, *stores[r], r, world);
  });
  std::vector<Trace> traces(world);
  if (std::all_of(errors.begin(), errors.end(), [](const auto& e) { return e.empty(); })) {
    std::vector<torch::nn::Sequential> nets;
    for (int r = 0; r < world; ++r) {
      nets.push_back(make_net(model, sync ? sync_batchnorm_layers(*bn_comms[r]) : nullptr));
    }
    in_ranks([&](int r) {
      Reducer reducer(nets[r]->parameters(), *comms[r], ReducerOptions{0.0005, 0.0001});
      // As Strategy::set_rank_share: each rank's gradient counts its share of the samples.
      if (shares[r] * world != total) reducer.set_scale(static_cast<float>(shares[r]) / total);
      train(nets[r], shares, r, &reducer, traces[r], dtype_for(model));
    });
  }
  // Each rank closes its own: a communicator may wait at close for its peers to close too.
  in_ranks([&](int r) {
    comms[r].reset();
    bn_comms[r].reset();
    stores[r].reset();
  });
  fs::remove_all(dir);
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return traces;
}

double max_relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const auto da = a.to(torch::kDouble), db = b.to(torch::kDouble);
  return ((da - db).abs().max() / db.abs().max().clamp_min(1e-12)).item<double>();
}

// The largest relative difference between the ranks' run and the one process's, over every
// step's outputs and gradients and the final parameters and buffers.
double compare(const std::vector<Trace>& ranks, const Trace& single, bool& shapes_match) {
  double worst = 0;
  shapes_match = true;
  const int world = static_cast<int>(ranks.size());
  for (int s = 0; s < kSteps; ++s) {
    std::vector<torch::Tensor> rows;
    for (const auto& t : ranks) rows.push_back(t.outputs[s]);
    worst = std::max(worst, max_relative_difference(torch::cat(rows, 0), single.outputs[s]));
    for (int r = 0; r < world; ++r) {
      shapes_match = shapes_match && ranks[r].gradients[s].size() == single.gradients[s].size();
      for (std::size_t i = 0; i < single.gradients[s].size() && shapes_match; ++i) {
        worst = std::max(worst,
                         max_relative_difference(ranks[r].gradients[s][i], single.gradients[s][i]));
      }
    }
  }
  for (const auto& t : ranks) {
    shapes_match = shapes_match && t.buffers.size() == single.buffers.size() &&
                   t.parameters.size() == single.parameters.size();
    for (std::size_t i = 0; i < single.parameters.size() && shapes_match; ++i) {
      worst = std::max(worst, max_relative_difference(t.parameters[i], single.parameters[i]));
    }
    for (std::size_t i = 0; i < single.buffers.size() && shapes_match; ++i) {
      worst = std::max(worst, max_relative_difference(t.buffers[i], single.buffers[i]));
    }
  }
  return worst;
}

Trace train_single(ModelName model, int world, const std::vector<int>& shares = {}) {
  auto net = make_net(model);
  Trace trace;
  train(net, rank_shares(world, shares), -1, nullptr, trace, dtype_for(model));
  return trace;
}

class SyncBatchNormEquivalence
    : public ::testing::TestWithParam<std::tuple<std::string, ModelName>> {};

TEST_P(SyncBatchNormEquivalence, RanksMatchOneProcessWithPlainBatchNorm) {
  const auto& [backend, model] = GetParam();
  if (!comm::backend_compiled_in(backend)) GTEST_SKIP() << backend << " is not compiled in";
  torch::set_num_threads(1);
  const int world = 2;
  const Trace single = train_single(model, world);
  bool shapes_match = false;
  const double synced = compare(train_ranks(backend, model, world, true), single, shapes_match);
  ASSERT_TRUE(shapes_match);
  EXPECT_LT(synced, 1e-4) << "outputs, gradients, parameters or statistics differ";
  std::printf("synced %g\n", synced);
  // Plain BatchNorm normalises each rank's half with that half's statistics: far apart. This
  // is what the comparison above would see if the layers did not communicate.
  const double plain = compare(train_ranks(backend, model, world, false), single, shapes_match);
  EXPECT_GT(plain, 1e-2);
  std::printf("plain %g\n", plain);
}

// Rank 0 holds 8 of a step's 10 samples and rank 1 2: the layers weigh each rank's sums by its
// samples in the statistics (forward) and in the input gradient (backward), where each rank's
// dy is the gradient of its own mean loss.
TEST(SyncBatchNormUneven, RanksOfUnequalSharesMatchOneProcess) {
  torch::set_num_threads(1);
  const std::vector<int> shares{8, 2};
  const Trace single = train_single(ModelName::kDigitalNet, 2, shares);
  bool shapes_match = false;
  const double synced = compare(train_ranks("asio-ring", ModelName::kDigitalNet, 2, true, shares),
                                single, shapes_match);
  ASSERT_TRUE(shapes_match);
  EXPECT_LT(synced, 1e-4) << "outputs, gradients, parameters or statistics differ";
  std::printf("synced %g\n", synced);
}

// resnet18's BatchNorm layers sit inside its blocks and their shortcuts.
INSTANTIATE_TEST_SUITE_P(
    Backends, SyncBatchNormEquivalence,
    ::testing::Values(std::tuple{std::string("asio-ring"), ModelName::kDigitalNet},
                      std::tuple{std::string("gloo"), ModelName::kDigitalNet},
                      std::tuple{std::string("shm"), ModelName::kDigitalNet},
                      std::tuple{std::string("asio-ring"), ModelName::kResnet18}),
    [](const auto& info) {
      std::string name =
          std::get<0>(info.param) + "_" + std::string(name_of(std::get<1>(info.param)));
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

TEST(SyncBatchNorm, KeepsBatchNormNamesAndStateAndNeedsNoPeersInEval) {
  auto net = make_net();
  {
    torch::NoGradGuard no_grad;
    net->named_buffers()["bn2.running_mean"].fill_(0.25);
  }
  // A communicator every collective of which fails: eval mode must not call it.
  class NoComm : public comm::Communicator {
   public:
    int rank() const override { return 0; }
    int size() const override { return 2; }
    std::string name() const override { return "none"; }
    void allreduce(comm::Buffer, comm::ReduceOp) override { throw CommError("called"); }
    void broadcast(comm::Buffer, int) override { throw CommError("called"); }
    void allgather(const comm::Buffer&, comm::Buffer) override { throw CommError("called"); }
    void barrier() override { throw CommError("called"); }
  } no_comm;
  auto converted = make_net(ModelName::kDigitalNet, sync_batchnorm_layers(no_comm));
  {
    torch::NoGradGuard no_grad;
    const auto source = net->named_parameters(), source_buffers = net->named_buffers();
    for (auto& p : converted->named_parameters()) p.value().copy_(source[p.key()]);
    for (auto& b : converted->named_buffers()) b.value().copy_(source_buffers[b.key()]);
  }
  const auto before = net->named_parameters(), after = converted->named_parameters();
  ASSERT_EQ(before.keys(), after.keys());
  ASSERT_EQ(net->named_buffers().keys(), converted->named_buffers().keys());
  EXPECT_EQ(converted->named_buffers()["bn2.running_mean"].mean().item<float>(), 0.25f);
  EXPECT_EQ(converted->named_buffers()["bn1.num_batches_tracked"].scalar_type(), torch::kLong);
  EXPECT_NE(dynamic_cast<SyncBatchNorm2dImpl*>(converted->named_children()["bn1"].get()), nullptr);

  converted->eval();
  net->eval();
  torch::NoGradGuard no_grad;
  auto x = step_data(0, 4).first;
  EXPECT_TRUE(torch::allclose(converted->forward(x), net->forward(x), 1e-5, 1e-6));
  converted->train();
  EXPECT_THROW(converted->forward(x), CommError);  // training does communicate
}

}  // namespace
}  // namespace partrain
