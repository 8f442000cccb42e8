// defines: DeviceMemory and read_device_memory() — the CUDA caching allocator's peak
// allocated and reserved bytes for one device, and what the driver reports in use there.
// Without a CUDA LibTorch every field is empty. See docs/parity.md for what each means.
#pragma once

#include <optional>

namespace partrain {

struct DeviceMemory {
  std::optional<double> peak_allocated_mb;  // tensors alive at the worst moment
  std::optional<double> peak_reserved_mb;   // allocator pool (>= allocated)
  std::optional<double> driver_used_mb;     // device-wide: total - free, all processes
};

DeviceMemory read_device_memory(int cuda_device);  // cuda_device < 0: CPU, all empty
void select_cuda_device(int cuda_device);          // before any other CUDA work

}  // namespace partrain
