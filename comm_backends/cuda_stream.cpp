#include "comm_backends/cuda_stream.h"

#include <utility>

#include "common/errors.h"

#ifdef PARTRAIN_WITH_CUDART

#include <cuda_runtime_api.h>

#include <algorithm>
#include <thread>

namespace partrain::comm {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  PARTRAIN_CHECK(status == cudaSuccess, CommError, "cuda: ", what,
                 " failed: ", cudaGetErrorString(status));
}

cudaStream_t stream_of(void* stream) {
  return stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
}

// Makes `device` current for a scope and gives the thread its own back afterwards: these
// calls run on LibTorch's autograd threads too, which keep their device set.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

bool cuda_runtime_compiled_in() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: none, and no error left behind for later calls
    return 0;
  }
  return count;
}

CudaEvent::CudaEvent(int device_index) : device_(device_index) {
  DeviceScope scope(device_);
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  event_ = event;
}

CudaEvent::~CudaEvent() {
  if (event_ == nullptr) return;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  cudaSetDevice(device_);
  cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  cudaSetDevice(previous);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    CudaEvent old(std::move(*this));
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void CudaEvent::record(void* stream) {
  PARTRAIN_CHECK(event_ != nullptr, Error, "cuda: record on an empty event");
  DeviceScope scope(device_);
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_), stream_of(stream)),
             "cudaEventRecord");
}

void CudaEvent::enqueue_wait(void* stream) const {
  PARTRAIN_CHECK(event_ != nullptr, Error, "cuda: wait on an empty event");
  DeviceScope scope(device_);
  check_cuda(cudaStreamWaitEvent(stream_of(stream), static_cast<cudaEvent_t>(event_), 0),
             "cudaStreamWaitEvent");
}

void CudaEvent::wait(std::chrono::milliseconds timeout, const std::string& what) const {
  PARTRAIN_CHECK(event_ != nullptr, Error, "cuda: wait on an empty event");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(2);
  // Bounded by `deadline`: cudaEventQuery never blocks, and the loop ends when it passes.
  while (true) {
    const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event_));
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) check_cuda(state, "cudaEventQuery");
    if (std::chrono::steady_clock::now() >= deadline) {
      throw CommError("cuda: " + what + " did not finish within " +
                      std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

CudaStream::CudaStream(int device_index) : device_(device_index) {
  DeviceScope scope(device_);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream;
}

CudaStream::~CudaStream() {
  int previous = 0;
  if (stream_ == nullptr || cudaGetDevice(&previous) != cudaSuccess) return;
  cudaSetDevice(device_);
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  cudaSetDevice(previous);
}

HostStaging::HostStaging(int device_index, std::chrono::milliseconds timeout)
    : device_(device_index),
      timeout_(timeout),
      stream_(device_index),
      ready_(device_index),
      done_(device_index) {}

HostStaging::~HostStaging() {
  for (auto& slot : slots_) {
    if (slot.data != nullptr) cudaFreeHost(slot.data);
  }
}

Buffer HostStaging::host_buffer(const Buffer& device, std::size_t slot) {
  PARTRAIN_CHECK(device.device == DeviceKind::cuda && device.device_index == device_, Error,
                 "host staging of a buffer that is not on cuda:", device_);
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  if (s.bytes < device.bytes()) {
    DeviceScope scope(device_);
    if (s.data != nullptr) check_cuda(cudaFreeHost(s.data), "cudaFreeHost");
    s.data = nullptr;
    s.bytes = 0;
    check_cuda(cudaHostAlloc(&s.data, device.bytes(), cudaHostAllocDefault), "cudaHostAlloc");
    s.bytes = device.bytes();
  }
  Buffer host = device;
  host.data = s.data;
  host.device = DeviceKind::cpu;
  host.device_index = 0;
  host.stream = nullptr;
  host.ready_event = nullptr;
  return host;
}

Buffer HostStaging::to_host(const Buffer& device, std::size_t slot, const CudaEvent* ready,
                            const std::string& what) {
  Buffer host = host_buffer(device, slot);
  DeviceScope scope(device_);
  if (ready != nullptr && ready->valid()) {
    ready->enqueue_wait(stream_.handle());
  } else {
    ready_.record(device.stream);
    ready_.enqueue_wait(stream_.handle());
  }
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  if (device.bytes() > 0) {
    check_cuda(
        cudaMemcpyAsync(host.data, device.data, device.bytes(), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (device to host)");
  }
  done_.record(stream_.handle());
  done_.wait(timeout_, "copy of " + what + " from the device to the host");
  return host;
}

void HostStaging::to_device(const Buffer& host, const Buffer& device, const std::string& what) {
  PARTRAIN_CHECK(host.bytes() == device.bytes(), Error, "host staging: ", host.bytes(),
                 " bytes staged for a device buffer of ", device.bytes());
  DeviceScope scope(device_);
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  if (device.bytes() > 0) {
    check_cuda(
        cudaMemcpyAsync(device.data, host.data, device.bytes(), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (host to device)");
  }
  done_.record(stream_.handle());
  done_.wait(timeout_, "copy of " + what + " from the host to the device");
}

}  // namespace partrain::comm

#else  // built without the CUDA runtime

namespace partrain::comm {
namespace {
[[noreturn]] void no_runtime() {
  throw UsageError(
      "CUDA buffers need partrain built with the CUDA toolkit (the CUDA runtime was not found "
      "at build time)");
}
}  // namespace

bool cuda_runtime_compiled_in() { return false; }
int cuda_device_count() { return 0; }

CudaEvent::CudaEvent(int device_index) : device_(device_index) { no_runtime(); }
CudaEvent::~CudaEvent() = default;
CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}
CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  device_ = other.device_;
  event_ = std::exchange(other.event_, nullptr);
  return *this;
}
void CudaEvent::record(void*) { no_runtime(); }
void CudaEvent::enqueue_wait(void*) const { no_runtime(); }
void CudaEvent::wait(std::chrono::milliseconds, const std::string&) const { no_runtime(); }

CudaStream::CudaStream(int device_index) : device_(device_index) { no_runtime(); }
CudaStream::~CudaStream() = default;

HostStaging::HostStaging(int device_index, std::chrono::milliseconds timeout)
    : device_(device_index), timeout_(timeout), stream_(device_index) {}
HostStaging::~HostStaging() = default;
Buffer HostStaging::host_buffer(const Buffer&, std::size_t) { no_runtime(); }
Buffer HostStaging::to_host(const Buffer&, std::size_t, const CudaEvent*, const std::string&) {
  no_runtime();
}
void HostStaging::to_device(const Buffer&, const Buffer&, const std::string&) { no_runtime(); }

}  // namespace partrain::comm

#endif
