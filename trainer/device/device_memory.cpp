#include "trainer/device/device_memory.h"

#include "common/errors.h"

#ifdef PARTRAIN_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace partrain {

DeviceMemory read_device_memory(int cuda_device) {
  DeviceMemory m;
#ifdef PARTRAIN_TORCH_CUDA
  if (cuda_device < 0) return m;
  constexpr double kMiB = 1024.0 * 1024.0;
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(cuda_device));
  // Index 0 of every statistic is StatType::AGGREGATE (both pools). The enum moved out of
  // CUDACachingAllocator in LibTorch 2.6 (c10::CachingDeviceAllocator); its first value did not.
  constexpr std::size_t aggregate = 0;
  m.peak_allocated_mb = static_cast<double>(stats.allocated_bytes[aggregate].peak) / kMiB;
  m.peak_reserved_mb = static_cast<double>(stats.reserved_bytes[aggregate].peak) / kMiB;
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    m.driver_used_mb = static_cast<double>(total_bytes - free_bytes) / kMiB;
  }
#else
  (void)cuda_device;
#endif
  return m;
}

void select_cuda_device(int cuda_device) {
#ifdef PARTRAIN_TORCH_CUDA
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(cuda_device));
#else
  throw UsageError("this partrain was built against a LibTorch without CUDA (device " +
                   std::to_string(cuda_device) + " requested)");
#endif
}

}  // namespace partrain
