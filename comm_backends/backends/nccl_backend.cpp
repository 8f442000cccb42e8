// The nccl backend: NCCL on CUDA buffers, on a stream of its own.
//
// Ordering, as c10d does it: the caller's data is ready -> an event on the caller's stream
// (the caller's own ready event, or one recorded here at the call) -> the communication
// stream waits for that event on the device -> the collective -> an event on the
// communication stream, which the host polls and the caller's stream is made to wait for.
// The communication stream is non-blocking, so it never waits implicitly for the legacy
// default stream where LibTorch computes: a gradient bucket goes on the wire as soon as
// its own gradients are written, not when the rest of backward has drained.
//
// The communicator is created non-blocking so that nothing NCCL does can hang us: init, the
// enqueueing of every collective and its completion are polled (ncclCommGetAsyncError,
// cudaEventQuery) until done or until the timeout, and on timeout the communicator is
// aborted (ncclCommAbort) before we throw.
#include "comm_backends/backends/backend.h"
#include "common/errors.h"

#ifdef PARTRAIN_WITH_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "comm_backends/net/local_address.h"
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
  explicit NcclCommunicator(const BackendArgs& args)
      : rank_(args.rank),
        size_(args.size()),
        device_(args.options.device_index),
        timeout_(args.options.timeout),
        store_(args.store),
        prefix_(args.prefix) {
    choose_nccl_interface(args.options.bind_host);
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    if (rank_ == 0) {
      PARTRAIN_CHECK(ncclGetUniqueId(&id) == ncclSuccess, CommError,
                     "nccl: ncclGetUniqueId failed");
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(&id);
      store_.set(prefix_ + "unique_id", std::vector<std::uint8_t>(bytes, bytes + sizeof id));
    } else {
      const auto value = store_.get(prefix_ + "unique_id");
      PARTRAIN_CHECK(value.size() == sizeof id, CommError, "nccl: unique id from the store has ",
                     value.size(), " bytes, expected ", sizeof id);
      std::memcpy(&id, value.data(), sizeof id);
    }
    store_.set(prefix_ + "joined/" + std::to_string(rank_), {1});

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t started = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    PARTRAIN_CHECK(started == ncclSuccess || started == ncclInProgress, CommError,
                   "nccl: ncclCommInitRankConfig failed: ", ncclGetErrorString(started));
    const auto deadline = Clock::now() + timeout_;
    bool ready = false;
    try {
      ready = wait_comm(deadline, nullptr);
    } catch (const PeerError& e) {
      throw CommError(e.what());  // outside a collective nobody traces whom it lost
    }
    if (!ready) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      // Name a rank that never reached the rendezvous, if there is one.
      for (int r = 0; r < size_; ++r) {
        if (!store_.check({prefix_ + "joined/" + std::to_string(r)})) {
          throw PeerError(r, "nccl: rank " + std::to_string(r) + " did not join within " +
                                 std::to_string(timeout_.count()) + " ms");
        }
      }
      throw CommError("nccl: communicator setup did not finish within " +
                      std::to_string(timeout_.count()) + " ms");
    }
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
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
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  Capabilities capabilities() const override {
    return {.host_memory = false, .device_memory = true, .native_reduce_scatter = true};
  }
  std::string last_algorithm() const override { return "nccl"; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    check_device_buffer(buffer);
    run("allreduce", &buffer, [&] {
      return ncclAllReduce(buffer.data, buffer.data, buffer.count, nccl_type(buffer.dtype),
                           nccl_op(op), comm_, stream_);
    });
  }

  // ncclReduceScatter takes the count each rank receives and leaves rank r's block in its
  // output; ordered after the input is ready, as the other collectives.
  void reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) override {
    check_device_buffer(in);
    check_device_buffer(out);
    run("reduce_scatter", &in, [&] {
      return ncclReduceScatter(in.data, out.data, out.count, nccl_type(in.dtype), nccl_op(op),
                               comm_, stream_);
    });
  }

  void broadcast(Buffer buffer, int root) override {
    check_device_buffer(buffer);
    run("broadcast", &buffer, [&] {
      return ncclBroadcast(buffer.data, buffer.data, buffer.count, nccl_type(buffer.dtype), root,
                           comm_, stream_);
    });
  }

  void allgather(const Buffer& in, Buffer out) override {
    check_device_buffer(in);
    check_device_buffer(out);
    run("allgather", &in, [&] {
      return ncclAllGather(in.data, out.data, in.count, nccl_type(in.dtype), comm_, stream_);
    });
  }

  void barrier() override {
    run("barrier", nullptr,
        [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }

 private:
  // The memory kind and null checks are CheckedCommunicator's (Capabilities).
  void check_device_buffer(const Buffer& buffer) const {
    PARTRAIN_CHECK(buffer.device_index == device_, UsageError,
                   "nccl: a buffer on cuda:", buffer.device_index,
                   " for a communicator on cuda:", device_);
    PARTRAIN_CHECK(!broken_, CommError,
                   "nccl: communicator aborted after an earlier failure; create a new one");
  }

  // Polls until NCCL has no operation in flight on comm_ (and, with an event, the event has
  // been reached); false on timeout. Throws on an asynchronous NCCL or CUDA error.
  bool wait_comm(Clock::time_point deadline, cudaEvent_t event) {
    auto pause = std::chrono::microseconds(5);
    // Bounded by `deadline`: neither query blocks.
    while (true) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        broken_ = true;
        fail(std::string("nccl: asynchronous error: ") + ncclGetErrorString(state));
      }
      if (state == ncclSuccess) {
        if (event == nullptr) return true;
        const cudaError_t query = cudaEventQuery(event);
        if (query == cudaSuccess) return true;
        if (query != cudaErrorNotReady) {
          broken_ = true;
          check_cuda(query, "cudaEventQuery");
        }
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  // Issues one collective on stream_, ordered after `data` is ready on the caller's stream
  // (no data: the barrier, which orders against nothing), and returns once it has finished.
  template <typename Issue>
  void run(const char* what, const Buffer* data, Issue&& issue) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    cudaStream_t caller = cudaStreamLegacy;
    if (data != nullptr) {
      if (data->stream != nullptr) caller = static_cast<cudaStream_t>(data->stream);
      cudaEvent_t ready = static_cast<cudaEvent_t>(data->ready_event);
      if (ready == nullptr) {
        check_cuda(cudaEventRecord(ready_, caller), "cudaEventRecord");
        ready = ready_;
      }
      check_cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    }
    const ncclResult_t issued = issue();
    if (issued != ncclSuccess && issued != ncclInProgress) {
      broken_ = true;
      throw CommError(std::string("nccl: ") + what + " failed: " + ncclGetErrorString(issued));
    }
    const auto deadline = Clock::now() + timeout_;
    // A non-blocking communicator may still be enqueueing the kernel when the call returns
    // (ncclInProgress); an event recorded before that would not cover it.
    bool finished = wait_comm(deadline, nullptr);
    if (finished) {
      check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
      finished = wait_comm(deadline, done_);
    }
    if (!finished) {
      broken_ = true;
      ncclCommAbort(comm_);
      comm_ = nullptr;
      fail(std::string("nccl: ") + what + " did not finish within " +
           std::to_string(timeout_.count()) + " ms; communicator aborted (a peer died or is hung)");
    }
    // Already reached, so this costs the caller's stream nothing; it keeps the ordering
    // explicit on the device as well.
    if (data != nullptr) {
      check_cuda(cudaStreamWaitEvent(caller, done_, 0), "cudaStreamWaitEvent");
    }
  }

  // NCCL's errors name no peer (ncclRemoteError, ncclSystemError, or a timeout here): -1. A
  // peer that died or hung makes every survivor fail at about the same moment, so the
  // survivors report through the store and the ranks that do not are the lost ones
  // (CheckedCommunicator, failure_trace.h).
  [[noreturn]] void fail(const std::string& text) { throw PeerError(-1, text); }

  // NCCL opens its own sockets and picks their NIC itself. Unless NCCL_SOCKET_IFNAME says
  // otherwise, it gets the NIC of the address the other backends would use, so that all of
  // them take the route the run was set up for.
  static void choose_nccl_interface(const std::string& bind_host) {
    const char* set = std::getenv("NCCL_SOCKET_IFNAME");
    if ((set != nullptr && *set != '\0') || net::is_loopback_host(bind_host)) return;
    const std::string name = net::interface_with_address(bind_host);
    if (!name.empty()) ::setenv("NCCL_SOCKET_IFNAME", ("=" + name).c_str(), 0);
  }

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  Store& store_;
  std::string prefix_;
  bool broken_ = false;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // non-blocking: no implicit sync with the legacy stream
  cudaEvent_t ready_ = nullptr;    // recorded on the caller's stream when it gives no event
  cudaEvent_t done_ = nullptr;     // recorded on stream_ after each collective
  void* scratch_ = nullptr;
};

// Nothing for CUDA buffers on Linux; else why `auto` leaves nccl alone.
std::optional<std::string> usable(const Placement& placement) {
#ifdef __linux__
  if (placement.device != DeviceKind::cuda)
    return "no CUDA device (NCCL reduces device memory only)";
  return std::nullopt;
#else
  (void)placement;
  return "NCCL runs on Linux only";
#endif
}

}  // namespace

constinit const BackendEntry kNcclBackend{"nccl", true, "", usable, make_backend<NcclCommunicator>};

}  // namespace partrain::comm

#else  // not compiled in: still a known name, with a clear way forward

namespace partrain::comm {
constinit const BackendEntry kNcclBackend{"nccl", false,
#ifdef _WIN32
                                          "NCCL does not exist on Windows; use asio-ring (or gloo)",
#else
                                          "install the CUDA toolkit and NCCL and rebuild with "
                                          "-DPARTRAIN_WITH_NCCL=ON, or use "
                                          "asio-ring",
#endif
                                          nullptr, nullptr};
}  // namespace partrain::comm

#endif
