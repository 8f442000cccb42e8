// Device memory for the nccl bench: cudaMalloc'ed once per rank at the largest size,
// filled and read back with synchronous copies outside the timed allreduce.
#include "cli/bench_memory.h"

#include "common/errors.h"

#ifdef PARTRAIN_WITH_NCCL
#include <cuda_runtime_api.h>
#endif

namespace partrain::cli {

#ifdef PARTRAIN_WITH_NCCL
namespace {
void check_cuda(cudaError_t status, const char* what) {
  PARTRAIN_CHECK(status == cudaSuccess, Error, "bench: ", what, ": ", cudaGetErrorString(status));
}
}  // namespace

int cuda_devices() {
  int count = 0;
  // No driver or no device is an answer here (0), not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}
#else
int cuda_devices() { return 0; }
#endif

BenchMemory::BenchMemory(std::size_t bytes, comm::DeviceKind kind, int device)
    : host_(bytes), kind_(kind), device_(device) {
  if (kind_ == comm::DeviceKind::cpu) return;
#ifdef PARTRAIN_WITH_NCCL
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  check_cuda(cudaMalloc(&device_data_, bytes == 0 ? 1 : bytes), "cudaMalloc");
#else
  throw UsageError("bench: CUDA memory needs a build with the nccl backend");
#endif
}

BenchMemory::~BenchMemory() {
#ifdef PARTRAIN_WITH_NCCL
  if (device_data_ != nullptr) cudaFree(device_data_);
#endif
}

void BenchMemory::to_collective(std::size_t bytes) {
  if (kind_ == comm::DeviceKind::cpu) return;
#ifdef PARTRAIN_WITH_NCCL
  check_cuda(cudaMemcpy(device_data_, host_.data(), bytes, cudaMemcpyHostToDevice),
             "cudaMemcpy to the device");
#else
  (void)bytes;
#endif
}

void BenchMemory::from_collective(std::size_t bytes) {
  if (kind_ == comm::DeviceKind::cpu) return;
#ifdef PARTRAIN_WITH_NCCL
  check_cuda(cudaMemcpy(host_.data(), device_data_, bytes, cudaMemcpyDeviceToHost),
             "cudaMemcpy from the device");
#else
  (void)bytes;
#endif
}

comm::Buffer BenchMemory::buffer(std::size_t count, comm::DType dtype) {
  comm::Buffer b;
  b.data = kind_ == comm::DeviceKind::cpu ? static_cast<void*>(host_.data()) : device_data_;
  b.count = count;
  b.dtype = dtype;
  b.device = kind_;
  b.device_index = device_;
  return b;
}

}  // namespace partrain::cli
