// defines: BenchMemory — the buffer one `partrain bench` rank reduces: host memory for the CPU
// backends, CUDA device memory for nccl (NCCL reduces device memory only) — and
// cuda_devices(). LibTorch-free; CUDA only where the nccl backend is compiled in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm_backends/buffer.h"

namespace partrain::cli {

// CUDA devices this process sees; 0 without CUDA or without the nccl backend compiled in.
int cuda_devices();

// `bytes` of memory on the host or on CUDA device `device`. The pattern is written into and
// checked in host(); to_collective() / from_collective() move it to and from the memory the
// collective works on (no copies for host memory).
class BenchMemory {
 public:
  BenchMemory(std::size_t bytes, comm::DeviceKind kind, int device);
  ~BenchMemory();
  BenchMemory(const BenchMemory&) = delete;
  BenchMemory& operator=(const BenchMemory&) = delete;

  std::uint8_t* host() { return host_.data(); }
  void to_collective(std::size_t bytes);
  void from_collective(std::size_t bytes);
  comm::Buffer buffer(std::size_t count, comm::DType dtype);

 private:
  std::vector<std::uint8_t> host_;
  comm::DeviceKind kind_;
  int device_;
  void* device_data_ = nullptr;
};

}  // namespace partrain::cli
