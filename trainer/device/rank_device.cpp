#include "trainer/device/rank_device.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <thread>

#include "common/cpu_list.h"
#include "common/errors.h"
#include "trainer/device/device_memory.h"
#include "trainer/device/torch_info.h"

namespace partrain {

c10::Device pick_device(const Config& cfg, const RankPlace& place) {
  int gpus = cuda_device_count();
  bool want_cuda =
      cfg.device == DeviceChoice::kCuda || (cfg.device == DeviceChoice::kAuto && gpus > 0);
  if (cfg.strategy == StrategyKind::kDp && gpus == 0) {
    throw UsageError(
        "strategy dp (DataParallel) replicates the model over CUDA devices, and this machine "
        "has none visible to LibTorch; use strategy: ddp with device: cpu instead");
  }
  if (!want_cuda) return c10::Device(c10::kCPU);
  if (gpus == 0) {
    throw UsageError("device: cuda, but LibTorch sees no CUDA device here (" + torch_version() +
                     "); use device: cpu or auto");
  }
  int index = place.local_rank % gpus;
  select_cuda_device(index);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void set_intra_op_threads(const Config& cfg, const RankPlace& place) {
  int threads = cfg.train.threads;
  if (threads == 0) {
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, place.local_world_size));
    // A rank bound to fewer CPUs than its share (launch.bind, an engine's binding, taskset)
    // gets no more threads than it may run on.
    const auto allowed = static_cast<int>(affinity_of(0).size());
    if (allowed > 0) threads = std::min(threads, allowed);
  }
  at::set_num_threads(threads);
}

std::vector<c10::Device> data_parallel_devices(const Config& cfg) {
  std::vector<c10::Device> devices;
  if (cfg.strategy != StrategyKind::kDp) return devices;
  for (int i = 0; i < cuda_device_count(); ++i) {
    devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
  }
  return devices;
}

}  // namespace partrain
