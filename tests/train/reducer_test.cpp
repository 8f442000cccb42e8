// DDP's defining property, checked in one process with ranks as threads: W ranks at batch b,
// each step's gradients averaged by the Reducer, end with the same parameters as one
// process at batch W*b — for every CPU backend, with SGD momentum and weight decay, with
// several buckets, and with gradient accumulation. Built a second time for tests/gpu with
// PARTRAIN_REDUCER_ON_CUDA: the same property with the parameters on CUDA devices, where the
// buckets are ordered against the compute stream by events and the host backends stage
// through pinned memory. Also, with a communicator that fails or hangs: the error names the
// bucket (and keeps the dead peer's rank), and the wait after backward ends at its bound.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <thread>

#include "comm_backends/communicator.h"
#include "common/errors.h"
#include "comm_backends/store/store.h"
#include "trainer/model/models.h"
#include "trainer/parallel/reducer.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string backend;
  int world;
  double bucket_mb;
  int accumulate;
  bool cuda = false;
  // Uneven shares of each step's samples (rank r takes r + 1 parts): each rank's gradient
  // counts its share in the sum (Reducer::set_scale). Without accumulation only.
  bool uneven = false;
};

// Rank r trains on cuda:(r mod devices) in the CUDA cases; the single-process reference on
// cuda:0.
torch::Device device_of(const Case& c, int rank) {
  if (!c.cuda) return torch::kCPU;
  const int devices = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank % devices));
}

constexpr int kBatch = 6;  // per rank, per micro-step
constexpr int kSteps = 4;

torch::nn::Sequential make_net() {
  ModelConfig c;
  c.name = ModelName::kDigitalNet;
  c.width = 4;
  c.norm = Norm::kNone;  // BatchNorm statistics depend on the batch split; DDP equality needs none
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
  const torch::Device device = device_of(c, 0);
  auto net = make_net();
  net->to(device);
  auto opt = make_optimizer(net);
  const int total = c.world * c.accumulate * kBatch;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = step_data(s, total);
    x = x.to(device);
    y = y.to(device);
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
  const torch::Device device = device_of(c, rank);
  co.device = device.is_cuda() ? comm::DeviceKind::cuda : comm::DeviceKind::cpu;
  co.device_index = device.is_cuda() ? device.index() : 0;
  auto comm = comm::make_communicator(co, *store, rank, c.world);
  net->to(device);

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
  const int total = c.world * c.accumulate * kBatch;
  int64_t share = kBatch, offset = static_cast<int64_t>(rank) * c.accumulate * kBatch;
  if (c.uneven) {
    const int parts = c.world * (c.world + 1) / 2;
    share = total / parts * (rank + 1);
    offset = total / parts * (rank * (rank + 1) / 2);
    reducer.set_scale(static_cast<float>(static_cast<double>(share) / total));
  } else {
    EXPECT_EQ(reducer.scale(), 1.0f / static_cast<float>(c.world));  // the default: 1 / W
  }
  if (c.bucket_mb < 0.01) {
    EXPECT_GT(reducer.bucket_count(), 2u);
    auto sizes = reducer.bucket_sizes();
    EXPECT_LE(sizes.front(), sizes[1]);  // the first bucket is the small one
  }
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = step_data(s, total);
    x = x.to(device);
    y = y.to(device);
    for (int m = 0; m < c.accumulate; ++m) {
      // Any split of the step's samples into equal parts gives the same mean gradient; so
      // does an uneven one when each part counts its share.
      const int64_t first = offset + m * share;
      auto loss = torch::nn::functional::cross_entropy(net->forward(x.narrow(0, first, share)),
                                                       y.narrow(0, first, share));
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
  if (c.cuda && !torch::cuda::is_available()) GTEST_SKIP() << "LibTorch sees no CUDA device here";
  if (c.backend == "nccl" && c.world > static_cast<int>(torch::cuda::device_count())) {
    GTEST_SKIP() << "nccl needs a GPU per rank";
  }
  if (!comm::backend_compiled_in(c.backend)) GTEST_SKIP() << c.backend << " is not compiled in";
  if (c.cuda) {
    // TF32 would round differently at the two batch sizes compared here.
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  const double tolerance = c.cuda ? 1e-4 : 2e-5;
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
      double diff = (results[r][i].cpu() - expected[i].cpu()).abs().max().item<double>();
      EXPECT_LT(diff, tolerance) << "rank " << r << " parameter " << i;
      // Every rank holds bit-identical parameters: they applied identical averaged gradients.
      EXPECT_TRUE(torch::equal(results[r][i].cpu(), results[0][i].cpu()))
          << "rank " << r << " parameter " << i;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
#ifdef PARTRAIN_REDUCER_ON_CUDA
  // Every case is listed wherever this is built and skips where it cannot run, so that the
  // test names do not depend on the machine. Two ranks may share one GPU on the host
  // backends; nccl needs one GPU per rank.
  for (const std::string b : {"asio-ring", "gloo"}) {
    out.push_back({b, 2, 25.0, 1, true});
    out.push_back({b, 2, 0.004, 2, true});  // many small buckets, accumulation
  }
  out.push_back({"nccl", 1, 0.004, 1, true});
  out.push_back({"nccl", 2, 0.004, 1, true});
#else
  std::vector<std::string> backends = {"asio-ring"};
  if (comm::backend_compiled_in("gloo")) backends.push_back("gloo");
  for (const auto& b : backends) {
    out.push_back({b, 2, 25.0, 1});
    out.push_back({b, 3, 0.004, 1});               // many small buckets
    out.push_back({b, 2, 0.004, 2});               // accumulation
    out.push_back({b, 3, 0.004, 1, false, true});  // uneven shares: 3, 6 and 9 of 18
  }
#endif
  return out;
}

#ifndef PARTRAIN_REDUCER_ON_CUDA
// A communicator of one rank whose allreduce fails as a dead peer would, or hangs until
// released (bounded), standing in for a real backend.
class FaultyCommunicator : public comm::Communicator {
 public:
  enum class Fault { peer_dies, hangs };
  explicit FaultyCommunicator(Fault fault) : fault_(fault) {}
  ~FaultyCommunicator() override { release(); }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "faulty"; }
  void allreduce(comm::Buffer, comm::ReduceOp) override {
    if (fault_ == Fault::peer_dies) throw PeerError(1, "rank 1 closed the connection");
    std::unique_lock<std::mutex> lock(mutex_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return released_; });
  }
  // Whether an allreduce has started, waiting at most 10 s for one.
  bool entered() {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return entered_; });
  }
  void broadcast(comm::Buffer, int) override {}
  void allgather(const comm::Buffer&, comm::Buffer) override {}
  void barrier() override {}
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  Fault fault_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
  bool entered_ = false;
};

void backward_one_step(torch::nn::Sequential& net, Reducer& reducer) {
  auto [x, y] = step_data(0, kBatch);
  reducer.prepare_for_backward(true);
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
}

// One rank over asio-ring, for what a Reducer holds.
std::unique_ptr<comm::Communicator> one_rank(const fs::path& dir,
                                             std::unique_ptr<comm::Store>& store) {
  comm::StoreOptions so;
  so.token = "reducer-memory";
  so.timeout = std::chrono::seconds(30);
  store = comm::open_store("file://" + dir.string(), so);
  comm::CommOptions co;
  co.backend = "asio-ring";
  co.timeout = std::chrono::seconds(30);
  co.token = so.token;
  return comm::make_communicator(co, *store, 0, 1);
}

// A gradient is held once: each .grad is its slot of a bucket, from the Reducer's start and
// after a step; the buckets hold the parameters' bytes and no more. With sharded gradients no
// .grad is kept and, after the step, no bucket either.
TEST(ReducerMemory, EachGradientIsItsSlotOfABucketOrIsDropped) {
  const fs::path dir =
      fs::temp_directory_path() / ("partrain_reducer_memory_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::unique_ptr<comm::Store> store;
  auto comm = one_rank(dir, store);
  auto net = make_net();
  std::int64_t parameter_bytes = 0;
  for (const auto& p : net->parameters()) parameter_bytes += static_cast<std::int64_t>(p.nbytes());
  auto in_a_bucket = [](const Reducer& reducer, const torch::Tensor& g) {
    for (std::size_t b = 0; b < reducer.bucket_count(); ++b) {
      const auto* begin = static_cast<const char*>(reducer.bucket(b).data_ptr());
      const auto* at = static_cast<const char*>(g.data_ptr());
      if (at >= begin && at < begin + reducer.bucket(b).nbytes()) return true;
    }
    return false;
  };
  {
    ReducerOptions ro;
    ro.bucket_mb = 0.004;
    Reducer reducer(net->parameters(), *comm, ro);
    EXPECT_EQ(reducer.bucket_bytes(), parameter_bytes);
    for (const auto& p : net->parameters()) EXPECT_TRUE(in_a_bucket(reducer, p.grad()));
    backward_one_step(net, reducer);
    reducer.finish_backward();
    for (const auto& p : net->parameters()) {
      EXPECT_TRUE(in_a_bucket(reducer, p.grad()));
      EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
    }
    EXPECT_EQ(reducer.peak_bucket_bytes(), parameter_bytes);
    reducer.zero_grad();
    for (const auto& p : net->parameters()) EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
  for (auto& p : net->parameters()) p.mutable_grad().reset();
  ReducerOptions ro;
  ro.bucket_mb = 0.004;
  ro.gradients = GradientHome::kShards;
  Reducer sharded(net->parameters(), *comm, ro);
  EXPECT_EQ(sharded.bucket_bytes(), 0);
  backward_one_step(net, sharded);
  sharded.finish_backward();
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(sharded.bucket_bytes(), 0);
  EXPECT_GT(sharded.peak_bucket_bytes(), 0);
  EXPECT_LT(sharded.peak_bucket_bytes(), parameter_bytes);
  fs::remove_all(dir);
}

TEST(ReducerFailure, APeerErrorNamesTheBucketAndKeepsThePeer) {
  auto net = make_net();
  FaultyCommunicator comm(FaultyCommunicator::Fault::peer_dies);
  Reducer reducer(net->parameters(), comm, ReducerOptions{});
  backward_one_step(net, reducer);
  try {
    reducer.finish_backward();
    FAIL() << "finish_backward() returned after a failed allreduce";
  } catch (const PeerError& e) {
    EXPECT_EQ(e.peer_rank(), 1);
    EXPECT_NE(std::string(e.what()).find("gradient bucket 0 of 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 closed"), std::string::npos) << e.what();
  }
}

TEST(ReducerFailure, AHungAllreduceEndsTheWaitAfterItsBound) {
  auto net = make_net();
  FaultyCommunicator comm(FaultyCommunicator::Fault::hangs);
  ReducerOptions ro;
  ro.timeout = std::chrono::milliseconds(100);  // bound: 2 x 100 ms + 5 s
  Reducer reducer(net->parameters(), comm, ro);
  backward_one_step(net, reducer);
  const auto start = std::chrono::steady_clock::now();
  try {
    reducer.finish_backward();
    FAIL() << "finish_backward() returned while the allreduce hung";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient bucket 0 of 1"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  comm.release();  // lets the communication thread finish before the reducer goes
}

// A reducer that goes while its bucket's collective hangs past the communicator's timeout (one
// that does not honour it) does not wait on it for good: after the timeout and 5 s it stops
// the process, saying why.
TEST(ReducerFailure, AReducerGoingWhileACollectiveHangsStopsTheRankAfterItsBound) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto net = make_net();
        FaultyCommunicator comm(FaultyCommunicator::Fault::hangs);
        ReducerOptions ro;
        ro.timeout = std::chrono::milliseconds(100);
        {
          Reducer reducer(net->parameters(), comm, ro);
          backward_one_step(net, reducer);  // the bucket's allreduce starts, and hangs
          if (!comm.entered()) std::exit(3);
        }
        std::exit(0);  // not reached
      },
      ::testing::ExitedWithCode(1),
      "the gradient communication thread is still inside a collective 5100 ms after");
}
#endif

INSTANTIATE_TEST_SUITE_P(Backends, ReducerEquivalence, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string name = info.param.backend + "_w" +
                                              std::to_string(info.param.world) + "_acc" +
                                              std::to_string(info.param.accumulate) +
                                              (info.param.bucket_mb < 1 ? "_small" : "_big") +
                                              (info.param.uneven ? "_uneven" : "");
                           for (auto& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace partrain
