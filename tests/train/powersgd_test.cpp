// PowerSGD as the Reducer's bucket reduction, with ranks as threads over asio-ring: at full
// rank it trains as plain DDP; its error feedback carries what a low rank failed to send
// (the sum of the applied gradients plus the ranks' error buffers is the sum of the true
// ones, and without it the sums drift apart); before start_step it is the plain allreduce,
// bit for bit; its checkpoint state resumes a run exactly; and it leaves vectors and small
// matrices uncompressed.
#include <ATen/core/ivalue.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "trainer/model/models.h"
#include "trainer/parallel/powersgd.h"
#include "trainer/parallel/reducer.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 2;

// Runs fn(rank, communicator) on `world` threads, each rank with its own asio-ring
// communicator; fails the test with the message of any rank that threw.
void run_ranks(const std::string& name, const std::function<void(int, comm::Communicator&)>& fn,
               int world = kWorld) {
  const std::string dir =
      (fs::temp_directory_path() / ("partrain_powersgd_" + std::to_string(::getpid()) + "_" + name))
          .string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::StoreOptions so;
        so.token = "powersgd-test";
        so.timeout = std::chrono::seconds(30);
        so.rank = r;
        so.world_size = world;
        auto store = comm::open_store("file://" + dir, so);
        comm::CommOptions co;
        co.backend = "asio-ring";
        co.timeout = std::chrono::seconds(30);
        co.token = so.token;
        auto comm = comm::make_communicator(co, *store, r, world);
        fn(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  fs::remove_all(dir);
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
}

// ----- Training a small convolutional net -------------------------------------------------

constexpr int kBatch = 6;  // per rank of kWorld; a step is kWorld * kBatch samples at any world

torch::nn::Sequential make_net() {
  ModelConfig c;
  c.name = ModelName::kDigitalNet;
  c.width = 4;
  c.norm = Norm::kNone;
  torch::manual_seed(11);
  return make_model(c, ModelShape{3, 16, 10});
}

std::pair<torch::Tensor, torch::Tensor> step_data(int step) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return {at::randn({kWorld * kBatch, 3, 16, 16}, gen), at::randint(0, 10, {kWorld * kBatch}, gen)};
}

// The net after `steps` SGD steps on `world` ranks (kWorld unless given), each taking an equal
// slice of the step's samples; powersgd empty: plain DDP. With state_in, the PowerSGD state is
// loaded first (as a resumed run does); state_out receives its saved state.
struct NetRun {
  std::vector<torch::Tensor> parameters[kWorld];
  std::size_t compressed = 0;
};
NetRun train_net(const std::string& name, std::optional<PowerSgdOptions> powersgd, int steps,
                 int first_step = 0, std::vector<torch::Tensor>* parameters_in = nullptr,
                 const c10::IValue* state_in = nullptr, c10::IValue* state_out = nullptr,
                 int world = kWorld) {
  NetRun out;
  std::vector<torch::nn::Sequential> nets;
  for (int r = 0; r < world; ++r) nets.push_back(make_net());
  const int batch = kWorld * kBatch / world;
  run_ranks(
      name,
      [&](int rank, comm::Communicator& comm) {
        torch::nn::Sequential net = nets[rank];
        if (parameters_in != nullptr) {
          torch::NoGradGuard no_grad;
          for (std::size_t i = 0; i < parameters_in->size(); ++i)
            net->parameters()[i].copy_((*parameters_in)[i]);
        }
        // Plain SGD: the optimizer holds no state, so a resume needs only parameters and PowerSGD.
        torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
        ReducerOptions ro;
        ro.bucket_mb = 0.004;  // several buckets
        ro.first_bucket_mb = 0.001;
        std::unique_ptr<PowerSgd> compression;
        Reducer reducer(net->parameters(), comm, ro);
        if (powersgd) {
          compression = std::make_unique<PowerSgd>(*powersgd, comm, reducer.bucket_contents(),
                                                   net->parameters().front().options());
          reducer.use_reduction(*compression);
          if (state_in != nullptr) compression->load(*state_in, "test state");
          if (rank == 0) out.compressed = compression->compressed_matrices();
        }
        for (int s = first_step; s < first_step + steps; ++s) {
          auto [x, y] = step_data(s);
          auto loss = torch::nn::functional::cross_entropy(
              net->forward(x.narrow(0, rank * batch, batch)), y.narrow(0, rank * batch, batch));
          reducer.prepare_for_backward(true);
          loss.backward();
          reducer.finish_backward();
          opt.step();
          opt.zero_grad();
        }
        if (compression && state_out != nullptr) {
          c10::IValue state = compression->save();  // every rank: it gathers the error buffers
          if (rank == 0) *state_out = state;
        }
        for (auto& p : net->parameters()) out.parameters[rank].push_back(p.detach().clone());
      },
      world);
  return out;
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
  return diff;
}

void expect_ranks_identical(const NetRun& run) {
  for (std::size_t i = 0; i < run.parameters[0].size(); ++i)
    EXPECT_TRUE(torch::equal(run.parameters[0][i], run.parameters[1][i])) << "parameter " << i;
}

// At a rank no lower than either side of any matrix, P^ spans the gradient's columns and
// P^ P^T M = M: training is plain DDP's up to rounding. A missing or wrong collective, a
// wrong reshape or a scale applied twice breaks the equality.
TEST(PowerSgd, FullRankTrainsAsPlainDdp) {
  torch::set_num_threads(1);
  const NetRun plain = train_net("plain", std::nullopt, 4);
  PowerSgdOptions po;
  po.rank = 1000;
  po.start_step = 0;
  po.compress_every_matrix = true;
  const NetRun full = train_net("full", po, 4);
  EXPECT_GE(full.compressed, 4u);  // every conv and linear weight
  EXPECT_LT(max_difference(full.parameters[0], plain.parameters[0]), 2e-5);
  expect_ranks_identical(full);
  // And at rank 1 it is not plain DDP: the test above can tell the two apart.
  po.rank = 1;
  po.compress_every_matrix = false;
  const NetRun low = train_net("low", po, 4);
  EXPECT_GT(max_difference(low.parameters[0], plain.parameters[0]), 1e-4);
  expect_ranks_identical(low);
}

// Stopping after 3 steps, saving the PowerSGD state and loading it into a fresh reduction
// (new Reducer, new factors drawn from the seed) continues exactly as the run that never
// stopped: the factors, each rank's error buffer and the step count all come back.
TEST(PowerSgd, SavedStateResumesExactly) {
  torch::set_num_threads(1);
  PowerSgdOptions po;
  po.rank = 1;
  po.start_step = 1;
  const NetRun straight = train_net("straight", po, 6);
  c10::IValue state;
  NetRun first = train_net("first", po, 3, 0, nullptr, nullptr, &state);
  ASSERT_TRUE(state.isGenericDict());
  EXPECT_EQ(state.toGenericDict().at("steps").toInt(), 3);
  EXPECT_EQ(state.toGenericDict().at("error").toTensor().size(0), kWorld);
  const NetRun resumed = train_net("resumed", po, 3, 3, &first.parameters[0], &state);
  for (std::size_t i = 0; i < straight.parameters[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed.parameters[0][i], straight.parameters[0][i]))
        << "parameter " << i;
  }
  // Without the state (new factors, no error buffers) the run goes elsewhere.
  const NetRun fresh = train_net("fresh", po, 3, 3, &first.parameters[0]);
  EXPECT_GT(max_difference(fresh.parameters[0], straight.parameters[0]), 1e-6);
}

// Resumed by one rank, the state of two goes on as the two-rank run would, to rounding: the
// one rank takes the sum of both error buffers (everything PowerSGD sends depends on them only
// through it). Giving the one rank a single buffer, or their mean, fails the comparison.
TEST(PowerSgd, StateResumesAtAnotherWorldSize) {
  torch::set_num_threads(1);
  PowerSgdOptions po;
  po.rank = 1;
  po.start_step = 1;
  const NetRun straight = train_net("straight_w2", po, 6);
  c10::IValue state;
  NetRun first = train_net("first_w2", po, 3, 0, nullptr, nullptr, &state);
  const NetRun resumed = train_net("resumed_w1", po, 3, 3, &first.parameters[0], &state, nullptr,
                                   /*world=*/1);
  EXPECT_LT(max_difference(resumed.parameters[0], straight.parameters[0]), 2e-5);
  // Without the error buffers the run goes elsewhere, by more than the tolerance above.
  c10::IValue dropped = state.toGenericDict().copy();
  dropped.toGenericDict().insert_or_assign(
      "error", at::zeros_like(state.toGenericDict().at("error").toTensor()));
  const NetRun no_error =
      train_net("no_error_w1", po, 3, 3, &first.parameters[0], &dropped, nullptr, /*world=*/1);
  EXPECT_GT(max_difference(no_error.parameters[0], straight.parameters[0]), 1e-4);
}

// ----- Gradients chosen by the test -------------------------------------------------------

constexpr int64_t kRows = 16, kCols = 12;

// One parameter of kRows x kCols whose gradient at each step is exactly `gradient(rank,
// step)` (the loss is sum(W * G)), reduced over the ranks; returns, per rank, the gradient
// the Reducer applied at each step and, with PowerSGD, the saved state at the end.
struct Applied {
  std::vector<torch::Tensor> steps[kWorld];
  c10::IValue state;
};
Applied reduce_gradients(const std::string& name, std::optional<PowerSgdOptions> powersgd,
                         int steps, const std::function<torch::Tensor(int, int)>& gradient) {
  Applied out;
  run_ranks(name, [&](int rank, comm::Communicator& comm) {
    torch::Tensor w = torch::zeros({kRows, kCols}, torch::requires_grad());
    torch::Tensor bias = torch::zeros({kCols}, torch::requires_grad());  // stays uncompressed
    Reducer reducer({w, bias}, comm, ReducerOptions{});
    std::unique_ptr<PowerSgd> compression;
    if (powersgd) {
      compression =
          std::make_unique<PowerSgd>(*powersgd, comm, reducer.bucket_contents(), w.options());
      reducer.use_reduction(*compression);
    }
    for (int s = 0; s < steps; ++s) {
      const torch::Tensor g = gradient(rank, s);
      reducer.prepare_for_backward(true);
      ((w * g).sum() + (bias * g[0]).sum()).backward();
      reducer.finish_backward();
      out.steps[rank].push_back(w.grad().clone());
      EXPECT_TRUE(
          torch::allclose(bias.grad(), (gradient(0, s)[0] + gradient(1, s)[0]) / 2, 1e-5, 1e-6))
          << "the uncompressed bias, step " << s;
      w.mutable_grad().zero_();
      bias.mutable_grad().zero_();
    }
    if (compression) {
      c10::IValue state = compression->save();
      if (rank == 0) out.state = state;
    }
  });
  return out;
}

// A signal of rank 3 that every rank sees, plus noise of each rank's own.
torch::Tensor structured_gradient(int rank, int step) {
  auto gen = at::detail::createCPUGenerator(7);
  auto u = std::get<0>(at::linalg_qr(at::randn({kRows, 3}, gen)));
  auto v = std::get<0>(at::linalg_qr(at::randn({kCols, 3}, gen)));
  auto signal = at::mm(u * torch::tensor({3.0f, 2.0f, 1.5f}), v.t());
  auto noise_gen = at::detail::createCPUGenerator(100 + 10 * step + rank);
  return signal + 0.3 * at::randn({kRows, kCols}, noise_gen);
}

// The sum over steps of what rank-1 PowerSGD applied, plus what the ranks' error buffers
// still owe, is the sum of the true averaged gradients: nothing is lost, only delayed. Without
// error feedback the directions a rank-1 factor never picks are lost for good, and the sums
// drift apart in proportion to the steps. Removing the error feedback fails both checks.
TEST(PowerSgd, ErrorFeedbackCarriesWhatWasNotSent) {
  torch::set_num_threads(1);
  constexpr int kSteps = 80;
  PowerSgdOptions po;
  po.rank = 1;
  po.start_step = 0;
  torch::Tensor truth = torch::zeros({kRows, kCols});
  for (int s = 0; s < kSteps; ++s)
    truth += (structured_gradient(0, s) + structured_gradient(1, s)) / 2;

  const Applied with = reduce_gradients("feedback", po, kSteps, structured_gradient);
  torch::Tensor applied = torch::zeros({kRows, kCols});
  for (const auto& g : with.steps[0]) applied += g;
  for (int s = 0; s < kSteps; ++s) ASSERT_TRUE(torch::equal(with.steps[0][s], with.steps[1][s]));
  // The error buffers are kept scaled (1/W): their plain sum is what the ranks owe the mean.
  const torch::Tensor owed =
      with.state.toGenericDict().at("error").toTensor().sum(0).view({kRows, kCols});
  EXPECT_TRUE(torch::allclose(applied + owed, truth, 1e-4, 1e-4))
      << (applied + owed - truth).abs().max().item<double>();
  const double drift_with = ((applied - truth).norm() / truth.norm()).item<double>();

  po.error_feedback = false;
  const Applied without = reduce_gradients("no_feedback", po, kSteps, structured_gradient);
  torch::Tensor applied_without = torch::zeros({kRows, kCols});
  for (const auto& g : without.steps[0]) applied_without += g;
  const double drift_without = ((applied_without - truth).norm() / truth.norm()).item<double>();
  EXPECT_LT(drift_with, 0.1);
  EXPECT_GT(drift_without, 0.4);
  EXPECT_GT(drift_without, 5 * drift_with);
}

// Before start_step every bucket is the plain allreduce: the same bits as no compression.
// The first compressed step differs (rank 1 cannot hold these gradients).
TEST(PowerSgd, BeforeStartStepIsPlainAllreduce) {
  torch::set_num_threads(1);
  PowerSgdOptions po;
  po.rank = 1;
  po.start_step = 3;
  const Applied plain = reduce_gradients("warmup_plain", std::nullopt, 4, structured_gradient);
  const Applied compressed = reduce_gradients("warmup_powersgd", po, 4, structured_gradient);
  for (int r = 0; r < kWorld; ++r) {
    for (int s = 0; s < 3; ++s) {
      EXPECT_TRUE(torch::equal(compressed.steps[r][s], plain.steps[r][s]))
          << "rank " << r << " step " << s;
    }
    EXPECT_FALSE(torch::allclose(compressed.steps[r][3], plain.steps[r][3], 1e-3, 1e-3));
  }
  EXPECT_EQ(compressed.state.toGenericDict().at("steps").toInt(), 4);
}

// What goes compressed and what the byte counts say: a 16 x 12 matrix at rank 2 sends
// 2 x (16 + 12) = 56 numbers instead of 192; a vector and a 2 x 3 matrix (2 x (2 + 3) = 10 is
// not less than 6) go as they are.
TEST(PowerSgd, VectorsAndSmallMatricesGoUncompressed) {
  // The layout alone decides; no collective runs.
  class NoCommunicator final : public comm::Communicator {
   public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return "none"; }
    void allreduce(comm::Buffer, comm::ReduceOp) override {}
    void broadcast(comm::Buffer, int) override {}
    void allgather(const comm::Buffer&, comm::Buffer) override {}
    void barrier() override {}
  } comm;
  BucketContents bucket;
  bucket.offsets = {0, 192, 204};
  bucket.shapes = {{16, 3, 4}, {12}, {2, 3}};
  PowerSgdOptions po;
  po.rank = 2;
  PowerSgd powersgd(po, comm, {bucket}, torch::TensorOptions().dtype(torch::kFloat));
  EXPECT_EQ(powersgd.compressed_matrices(), 1u);
  EXPECT_EQ(powersgd.uncompressed_bytes_per_step(), (192u + 12 + 6) * 4);
  EXPECT_EQ(powersgd.bytes_per_step(), (2u * (16 + 12) + 12 + 6) * 4);
  po.compress_every_matrix = true;
  EXPECT_EQ(PowerSgd(po, comm, {bucket}, torch::TensorOptions().dtype(torch::kFloat))
                .compressed_matrices(),
            2u);
}

}  // namespace
}  // namespace partrain
