// The nccl backend: NCCL on CUDA buffers, on the caller's stream.
//
// The communicator is created non-blocking so that nothing NCCL does can hang us: init and
// every collective are polled (ncclCommGetAsyncError, cudaStreamQuery) until done or until
// the timeout, and on timeout the communicator is aborted (ncclCommAbort) before we throw.
// A collective returns when its work on the caller's stream has completed.
#include "comm_backends/backends/backend.h"
#include "common/errors.h"

#ifdef PARTRAIN_WITH_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "comm_backends/store/store.h"

namespace partrain::comm {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

void check_cuda(cudaError_t status, const char* what) {
  PARTRAIN_CHECK(status == cudaSuccess, CommError, "nccl: ", what,
                 " failed: ", cudaGetErrorString(status));
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const CommOptions& options, Store& store, int rank, int size,
                   const std::string& prefix)
      : rank_(rank), size_(size), device_(options.device_index), timeout_(options.timeout) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    if (rank == 0) {
      PARTRAIN_CHECK(ncclGetUniqueId(&id) == ncclSuccess, CommError,
                     "nccl: ncclGetUniqueId failed");
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(&id);
      store.set(prefix + "unique_id", std::vector<std::uint8_t>(bytes, bytes + sizeof id));
    } else {
      const auto value = store.get(prefix + "unique_id");
      PARTRAIN_CHECK(value.size() == sizeof id, CommError, "nccl: unique id from the store has ",
                     value.size(), " bytes, expected ", sizeof id);
      std::memcpy(&id, value.data(), sizeof id);
    }
    store.set(prefix + "joined/" + std::to_string(rank), {1});

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t started = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    PARTRAIN_CHECK(started == ncclSuccess || started == ncclInProgress, CommError,
                   "nccl: ncclCommInitRankConfig failed: ", ncclGetErrorString(started));
    const auto deadline = Clock::now() + timeout_;
    if (!wait_comm(deadline, nullptr)) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      // Name a rank that never reached the rendezvous, if there is one.
      for (int r = 0; r < size; ++r) {
        if (!store.check({prefix + "joined/" + std::to_string(r)})) {
          throw PeerError(r, "nccl: rank " + std::to_string(r) + " did not join within " +
                                 std::to_string(timeout_.count()) + " ms");
        }
      }
      throw CommError("nccl: communicator setup did not finish within " +
                      std::to_string(timeout_.count()) + " ms");
    }
    check_cuda(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (broken_)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (own_stream_ != nullptr) cudaStreamDestroy(own_stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    check_device_buffer(buffer);
    std::lock_guard<std::mutex> lock(mutex_);
    auto stream = static_cast<cudaStream_t>(buffer.stream);
    run("allreduce", stream, [&] {
      return ncclAllReduce(buffer.data, buffer.data, buffer.count, nccl_type(buffer.dtype),
                           nccl_op(op), comm_, stream);
    });
  }

  void broadcast(Buffer buffer, int root) override {
    check_device_buffer(buffer);
    PARTRAIN_CHECK(root >= 0 && root < size_, UsageError, "broadcast: root ", root,
                   " is outside a world of ", size_);
    std::lock_guard<std::mutex> lock(mutex_);
    auto stream = static_cast<cudaStream_t>(buffer.stream);
    run("broadcast", stream, [&] {
      return ncclBroadcast(buffer.data, buffer.data, buffer.count, nccl_type(buffer.dtype), root,
                           comm_, stream);
    });
  }

  void allgather(const Buffer& in, Buffer out) override {
    check_device_buffer(in);
    check_device_buffer(out);
    check_allgather_buffers(in, out, size_);
    std::lock_guard<std::mutex> lock(mutex_);
    auto stream = static_cast<cudaStream_t>(out.stream);
    run("allgather", stream, [&] {
      return ncclAllGather(in.data, out.data, in.count, nccl_type(in.dtype), comm_, stream);
    });
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mutex_);
    run("barrier", own_stream_, [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, own_stream_);
    });
  }

 private:
  void check_device_buffer(const Buffer& buffer) const {
    PARTRAIN_CHECK(buffer.device == DeviceKind::cuda, UsageError,
                   "comm backend 'nccl' works on CUDA buffers; use asio-ring or gloo for CPU");
    PARTRAIN_CHECK(buffer.count == 0 || buffer.data != nullptr, UsageError,
                   "collective on a null buffer");
    PARTRAIN_CHECK(!broken_, CommError,
                   "nccl: communicator aborted after an earlier failure; create a new one");
  }

  // Polls until NCCL has no operation in flight on comm_ (and, with a stream, the stream
  // has drained); false on timeout. Throws on an asynchronous NCCL error.
  bool wait_comm(Clock::time_point deadline, cudaStream_t* stream) {
    auto pause = std::chrono::microseconds(5);
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        broken_ = true;
        throw CommError(std::string("nccl: asynchronous error: ") + ncclGetErrorString(state));
      }
      if (state == ncclSuccess) {
        if (stream == nullptr) return true;
        const cudaError_t query = cudaStreamQuery(*stream);
        if (query == cudaSuccess) return true;
        if (query != cudaErrorNotReady) {
          broken_ = true;
          check_cuda(query, "cudaStreamQuery");
        }
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  template <typename Issue>
  void run(const char* what, cudaStream_t stream, Issue&& issue) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const ncclResult_t issued = issue();
    if (issued != ncclSuccess && issued != ncclInProgress) {
      broken_ = true;
      throw CommError(std::string("nccl: ") + what + " failed: " + ncclGetErrorString(issued));
    }
    if (!wait_comm(Clock::now() + timeout_, &stream)) {
      broken_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw CommError(std::string("nccl: ") + what + " did not finish within " +
                      std::to_string(timeout_.count()) +
                      " ms; communicator aborted (a peer died or is hung)");
    }
  }

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  bool broken_ = false;
  std::mutex mutex_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t own_stream_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

Backend nccl_backend() {
  Backend backend;
  backend.name = "nccl";
  backend.compiled_in = true;
  backend.usable = [](const CommOptions& options) {
#ifdef __linux__
    return options.device == DeviceKind::cuda;
#else
    (void)options;
    return false;
#endif
  };
  backend.make = [](const CommOptions& options, Store& store, int rank, int size,
                    const std::string& prefix) -> std::unique_ptr<Communicator> {
    return std::make_unique<NcclCommunicator>(options, store, rank, size, prefix);
  };
  return backend;
}

}  // namespace partrain::comm

#else  // not compiled in: still a known name, with a clear way forward

namespace partrain::comm {
Backend nccl_backend() {
  Backend backend;
  backend.name = "nccl";
#ifdef _WIN32
  backend.how_to_get = "NCCL does not exist on Windows; use asio-ring (or gloo)";
#else
  backend.how_to_get =
      "install the CUDA toolkit and NCCL and rebuild with -DPARTRAIN_WITH_NCCL=ON, or use "
      "asio-ring";
#endif
  return backend;
}
}  // namespace partrain::comm

#endif
