// DDP's defining property, checked in one process with ranks as threads: W ranks at batch b,
// each step's gradients averaged by the Reducer, end with the same parameters as one
// process at batch W*b — for every CPU backend, with SGD momentum and weight decay, with
// several buckets, and with gradient accumulation.
#include "trainer/train/reducer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <thread>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "trainer/train/models.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string backend;
  int world;
  double bucket_mb;
  int accumulate;
};

constexpr int kBatch = 6;  // per rank, per micro-step
constexpr int kSteps = 4;

torch::nn::Sequential make_net() {
  ModelConfig c;
  c.name = "digitalnet";
  c.width = 4;
  c.norm = "none";  // BatchNorm statistics depend on the batch split; DDP equality needs none
  torch::manual_seed(11);
  return make_model(c, ModelShape{3, 16, 10});
}

torch::optim::SGD make_optimizer(torch::nn::Sequential& net) {
  return torch::optim::SGD(net->parameters(),
                           torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(5e-4));
}

// All samples of one optimizer step, for everyone: [world * accumulate * kBatch, ...].
std::pair<torch::Tensor, torch::Tensor> step_data(int step, int total) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  auto x = at::randn({total, 3, 16, 16}, gen);
  auto y = at::randint(0, 10, {total}, gen);
  return {x, y};
}

std::vector<torch::Tensor> train_single(const Case& c) {
  auto net = make_net();
  auto opt = make_optimizer(net);
  const int total = c.world * c.accumulate * kBatch;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = step_data(s, total);
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    opt.step();
    opt.zero_grad();
  }
  return net->parameters();
}

// `net` is built by the caller: LibTorch's global generator is shared by all threads, so the
// rank threads must not draw initial weights concurrently.
std::vector<torch::Tensor> train_rank(const Case& c, const std::string& dir, int rank,
                                      torch::nn::Sequential net) {
  comm::StoreOptions so;
  so.token = "reducer-test";
  so.timeout = std::chrono::seconds(30);
  so.rank = rank;
  so.world_size = c.world;
  auto store = comm::open_store("file://" + dir, so);
  comm::CommOptions co;
  co.backend = c.backend;
  co.timeout = std::chrono::seconds(30);
  co.token = so.token;
  auto comm = comm::make_communicator(co, *store, rank, c.world);

  // As in a real run: rank 0's initial state wins. Perturb the others first, so the
  // broadcast has something to fix.
  if (rank != 0) {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.add_(1.0);
  }
  broadcast_from_rank0(net->parameters(), *comm);
  auto opt = make_optimizer(net);
  ReducerOptions ro;
  ro.bucket_mb = c.bucket_mb;
  ro.first_bucket_mb = c.bucket_mb / 4;
  Reducer reducer(net->parameters(), *comm, ro);
  if (c.bucket_mb < 0.01) {
    EXPECT_GT(reducer.bucket_count(), 2u);
    auto sizes = reducer.bucket_sizes();
    EXPECT_LE(sizes.front(), sizes[1]);  // the first bucket is the small one
  }
  const int total = c.world * c.accumulate * kBatch;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = step_data(s, total);
    for (int m = 0; m < c.accumulate; ++m) {
      // Any split of the step's samples into equal parts gives the same mean gradient.
      int64_t first = (static_cast<int64_t>(rank) * c.accumulate + m) * kBatch;
      auto loss = torch::nn::functional::cross_entropy(net->forward(x.narrow(0, first, kBatch)),
                                                       y.narrow(0, first, kBatch));
      bool sync = m + 1 == c.accumulate;
      reducer.prepare_for_backward(sync);
      (loss / c.accumulate).backward();
      if (sync) reducer.finish_backward();
    }
    opt.step();
    opt.zero_grad();
  }
  return net->parameters();
}

class ReducerEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(ReducerEquivalence, RanksMatchOneProcess) {
  const Case c = GetParam();
  torch::set_num_threads(1);
  auto expected = train_single(c);

  std::string dir = (fs::temp_directory_path() /
                     ("partrain_reducer_" + std::to_string(::getpid()) + "_" + c.backend + "_" +
                      std::to_string(c.world) + "_" + std::to_string(c.accumulate)))
                        .string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::vector<torch::Tensor>> results(c.world);
  std::vector<std::string> errors(c.world);
  std::vector<torch::nn::Sequential> nets;
  for (int r = 0; r < c.world; ++r) nets.push_back(make_net());
  std::vector<std::thread> threads;
  for (int r = 0; r < c.world; ++r) {
    threads.emplace_back([&, r] {
      try {
        results[r] = train_rank(c, dir, r, nets[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  fs::remove_all(dir);
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(results[r].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      double diff = (results[r][i] - expected[i]).abs().max().item<double>();
      EXPECT_LT(diff, 2e-5) << "rank " << r << " parameter " << i;
      // Every rank holds bit-identical parameters: they applied identical averaged gradients.
      EXPECT_TRUE(torch::equal(results[r][i], results[0][i])) << "rank " << r << " parameter " << i;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  std::vector<std::string> backends = {"asio-ring"};
  if (comm::backend_compiled_in("gloo")) backends.push_back("gloo");
  for (const auto& b : backends) {
    out.push_back({b, 2, 25.0, 1});
    out.push_back({b, 3, 0.004, 1});  // many small buckets
    out.push_back({b, 2, 0.004, 2});  // accumulation
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, ReducerEquivalence, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string name = info.param.backend + "_w" +
                                              std::to_string(info.param.world) + "_acc" +
                                              std::to_string(info.param.accumulate) +
                                              (info.param.bucket_mb < 1 ? "_small" : "_big");
                           for (auto& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace partrain
