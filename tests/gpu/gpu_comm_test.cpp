// comm_backends on a real GPU, without LibTorch: a collective on a CUDA buffer is ordered
// after the caller's data and nothing more. The compute stream (the legacy default stream)
// is held shut by a gate, a host function queued on it that waits for the test to open it:
// a collective given a ready event recorded before the gate must finish while the gate is
// shut (had it waited for the compute stream, it would time out instead), and one given no
// event must see data that is only written after the gate opens. Device and pinned memory
// are allocated, and NCCL warmed up, before a gate shuts: allocations may synchronise with
// the device. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm_backends/communicator.h"
#include "comm_backends/cuda_stream.h"
#include "common/errors.h"
#include "comm_backends/store/store.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using namespace std::chrono_literals;
using testing::run_ranks;
using testing::ScratchDir;

#define REQUIRE_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible here"

void check(cudaError_t status) { ASSERT_EQ(status, cudaSuccess) << cudaGetErrorString(status); }

// Holds the legacy default stream at the point where it is made, until open() or 60 s.
class StreamGate {
 public:
  StreamGate() {
    const cudaError_t status = cudaLaunchHostFunc(cudaStreamLegacy, &StreamGate::hold, this);
    EXPECT_EQ(status, cudaSuccess) << cudaGetErrorString(status);
    launched_ = status == cudaSuccess;
  }
  ~StreamGate() {
    open();
    // The host function reads this object: wait, bounded, until it has returned.
    for (int i = 0; launched_ && !left_ && i < 60000; ++i) std::this_thread::sleep_for(1ms);
  }
  void open() { open_ = true; }

 private:
  static void CUDART_CB hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!gate->open_ && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    gate->left_ = true;
  }
  std::atomic<bool> open_{false};
  std::atomic<bool> left_{false};
  bool launched_ = false;
};

// Device memory of `count` floats, zeroed.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&data_, count * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0, count * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(data_); }
  Buffer buffer() const {
    Buffer b;
    b.data = data_;
    b.count = count_;
    b.device = DeviceKind::cuda;
    return b;
  }
  void write(const std::vector<float>& values) {
    EXPECT_EQ(cudaMemcpy(data_, values.data(), count_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> read() const {
    std::vector<float> out(count_);
    EXPECT_EQ(cudaMemcpy(out.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  void* data_ = nullptr;
  std::size_t count_;
};

std::vector<float> ramp(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i % 1000);
  return v;
}

std::unique_ptr<Communicator> open_comm(const std::string& backend, const ScratchDir& dir,
                                        std::unique_ptr<Store>& store, int rank, int world) {
  StoreOptions so;
  so.token = "gpu-comm-test";
  so.timeout = 20s;
  so.rank = rank;
  so.world_size = world;
  store = open_store(dir.url(), so);
  CommOptions co;
  co.backend = backend;
  co.timeout = 5s;  // a collective that waits for the gate fails after this
  co.device = DeviceKind::cuda;
  co.token = so.token;
  return make_communicator(co, *store, rank, world);
}

constexpr std::size_t kCount = 1 << 20;

TEST(GpuComm, NcclDoesNotWaitForComputeQueuedAfterTheReadyEvent) {
  REQUIRE_GPU();
  if (!backend_compiled_in("nccl")) GTEST_SKIP() << "nccl is not compiled in";
  ScratchDir dir;
  std::unique_ptr<Store> store;
  auto comm = open_comm("nccl", dir, store, 0, 1);
  DeviceFloats in(kCount), out(kCount);
  comm->allreduce(in.buffer(), ReduceOp::sum);  // warm-up: NCCL may set up on first use
  comm->allgather(in.buffer(), out.buffer());
  const auto values = ramp(kCount, 0.5f);
  in.write(values);
  CudaEvent ready(0);
  ready.record(nullptr);
  {
    StreamGate gate;  // the rest of "backward", not yet run
    Buffer data = in.buffer();
    data.ready_event = ready.handle();
    ASSERT_NO_THROW(comm->allreduce(data, ReduceOp::sum));
    ASSERT_NO_THROW(comm->allgather(data, out.buffer()));
  }
  EXPECT_EQ(out.read(), values);
  EXPECT_EQ(in.read(), values);
}

TEST(GpuComm, NcclWithoutReadyEventWaitsForWorkQueuedBefore) {
  REQUIRE_GPU();
  if (!backend_compiled_in("nccl")) GTEST_SKIP() << "nccl is not compiled in";
  ScratchDir dir;
  std::unique_ptr<Store> store;
  auto comm = open_comm("nccl", dir, store, 0, 1);
  DeviceFloats in(kCount), out(kCount);
  comm->allgather(in.buffer(), out.buffer());  // warm-up
  const auto values = ramp(kCount, 2.0f);
  float* pinned = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kCount * sizeof(float), 0));
  std::memcpy(pinned, values.data(), kCount * sizeof(float));
  std::exception_ptr error;
  {
    StreamGate gate;
    // Written on the compute stream only once the gate opens.
    check(cudaMemcpyAsync(in.buffer().data, pinned, kCount * sizeof(float), cudaMemcpyHostToDevice,
                          cudaStreamLegacy));
    std::thread collective([&] {
      try {
        comm->allgather(in.buffer(), out.buffer());
      } catch (...) {
        error = std::current_exception();
      }
    });
    std::this_thread::sleep_for(300ms);
    gate.open();
    collective.join();
  }
  if (error) std::rethrow_exception(error);
  EXPECT_EQ(out.read(), values);
  cudaFreeHost(pinned);
}

// The host backends' staging, as the trainer uses it: device -> pinned host on a copy
// stream after the ready event, the collective on host memory, pinned host -> device.
void staged_allreduce_does_not_wait_for_compute(const std::string& backend) {
  constexpr int kWorld = 2;
  ScratchDir dir;
  std::vector<std::unique_ptr<DeviceFloats>> data;
  std::vector<std::unique_ptr<HostStaging>> staging;
  std::vector<CudaEvent> ready;
  for (int r = 0; r < kWorld; ++r) {
    data.push_back(std::make_unique<DeviceFloats>(kCount));
    data.back()->write(ramp(kCount, static_cast<float>(r + 1)));
    staging.push_back(std::make_unique<HostStaging>(0, 5s));
    staging.back()->host_buffer(data.back()->buffer(), 0);
    ready.emplace_back(0);
    ready.back().record(nullptr);
  }
  {
    StreamGate gate;
    run_ranks(kWorld, [&](int rank) {
      std::unique_ptr<Store> store;
      auto comm = open_comm(backend, dir, store, rank, kWorld);
      const Buffer device = data[rank]->buffer();
      const std::string what = "rank " + std::to_string(rank) + "'s buffer";
      Buffer host = staging[rank]->to_host(device, 0, &ready[rank], what);
      comm->allreduce(host, ReduceOp::sum);
      staging[rank]->to_device(host, device, what);
    });
  }
  const auto expected = ramp(kCount, 3.0f);  // 1x + 2x
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(data[r]->read(), expected) << "rank " << r;
}

TEST(GpuComm, StagedAsioRingDoesNotWaitForCompute) {
  REQUIRE_GPU();
  staged_allreduce_does_not_wait_for_compute("asio-ring");
}

TEST(GpuComm, StagedGlooDoesNotWaitForCompute) {
  REQUIRE_GPU();
  if (!backend_compiled_in("gloo")) GTEST_SKIP() << "gloo is not compiled in";
  staged_allreduce_does_not_wait_for_compute("gloo");
}

TEST(GpuComm, StagingWithoutReadyEventCopiesWhatWasQueuedBefore) {
  REQUIRE_GPU();
  DeviceFloats in(kCount);
  const auto values = ramp(kCount, 4.0f);
  float* pinned = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kCount * sizeof(float), 0));
  std::memcpy(pinned, values.data(), kCount * sizeof(float));
  HostStaging staging(0, 10s);
  staging.host_buffer(in.buffer(), 0);
  std::vector<float> seen;
  std::exception_ptr error;
  {
    StreamGate gate;
    check(cudaMemcpyAsync(in.buffer().data, pinned, kCount * sizeof(float), cudaMemcpyHostToDevice,
                          cudaStreamLegacy));
    std::thread copy([&] {
      try {
        Buffer host = staging.to_host(in.buffer(), 0, nullptr, "the test buffer");
        const float* f = static_cast<const float*>(host.data);
        seen.assign(f, f + kCount);
      } catch (...) {
        error = std::current_exception();
      }
    });
    std::this_thread::sleep_for(300ms);
    gate.open();
    copy.join();
  }
  if (error) std::rethrow_exception(error);
  EXPECT_EQ(seen, values);
  cudaFreeHost(pinned);
}

TEST(GpuComm, EventWaitIsBoundedAndNamesWhatItWaitedFor) {
  REQUIRE_GPU();
  StreamGate gate;
  CudaEvent after_gate(0);
  after_gate.record(nullptr);
  const auto start = std::chrono::steady_clock::now();
  try {
    after_gate.wait(200ms, "gradient bucket 3");
    FAIL() << "the wait returned while the stream was held";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("gradient bucket 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("200 ms"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  gate.open();
}

}  // namespace
}  // namespace partrain::comm
