// defines: CudaEvent, CudaStream, HostStaging — the CUDA runtime pieces that order a
// collective against the caller's compute stream without draining it, and
// cuda_runtime_compiled_in(). Handles are void* so that this header needs no CUDA toolkit.
//
// Stream handles follow Buffer::stream: nullptr stands for the legacy default stream, the
// one LibTorch computes on unless told otherwise. The streams made here are non-blocking:
// they do not synchronise implicitly with the legacy default stream, so every ordering
// between the two goes through an event (record on one stream, wait on the other).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "comm_backends/buffer.h"

namespace partrain::comm {

// False where partrain_comm was built without the CUDA runtime; everything below then
// throws UsageError when constructed.
bool cuda_runtime_compiled_in();

// Visible CUDA devices; 0 without the runtime, a driver or a device.
int cuda_device_count();

class CudaEvent {
 public:
  CudaEvent() = default;  // no event
  explicit CudaEvent(int device_index);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool valid() const { return event_ != nullptr; }
  void* handle() const { return event_; }
  // Marks the point reached by the work queued on `stream` so far.
  void record(void* stream);
  // Makes `stream` wait, on the device, for the recorded point; the host does not wait.
  void enqueue_wait(void* stream) const;
  // Polls until the recorded point has been reached; after `timeout` throws CommError
  // naming `what`.
  void wait(std::chrono::milliseconds timeout, const std::string& what) const;

 private:
  int device_ = 0;
  void* event_ = nullptr;
};

// A non-blocking stream of its own on one device.
class CudaStream {
 public:
  explicit CudaStream(int device_index);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  void* handle() const { return stream_; }

 private:
  int device_ = 0;
  void* stream_ = nullptr;
};

// Collectives of the host backends (gloo, asio-ring) on CUDA buffers go through host
// memory. HostStaging makes that a side path: the copies run on a copy stream of its own,
// into and out of pinned host memory, after an event on the compute stream, so they wait
// only for the data they copy, and the compute stream never waits for them. Slots are
// pinned buffers kept between calls (cudaFreeHost would synchronise the whole device),
// grown when a larger buffer comes. One caller at a time.
class HostStaging {
 public:
  HostStaging(int device_index, std::chrono::milliseconds timeout);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // A pinned host buffer shaped like `device`, in slot `slot`; its content is undefined.
  Buffer host_buffer(const Buffer& device, std::size_t slot);
  // Copies `device` into slot `slot` and returns that host buffer once the copy is done. The
  // copy starts after `ready` when given (an event the caller recorded when the data was
  // complete), else after the work queued on device.stream so far.
  Buffer to_host(const Buffer& device, std::size_t slot, const CudaEvent* ready,
                 const std::string& what);
  // Copies `host` back into `device` and returns once it is there.
  void to_device(const Buffer& host, const Buffer& device, const std::string& what);

 private:
  struct Slot {
    void* data = nullptr;
    std::size_t bytes = 0;
  };

  int device_;
  std::chrono::milliseconds timeout_;
  CudaStream stream_;
  CudaEvent ready_;  // recorded on the caller's stream when no ready event is given
  CudaEvent done_;   // recorded on stream_ after each copy
  std::vector<Slot> slots_;
};

}  // namespace partrain::comm
