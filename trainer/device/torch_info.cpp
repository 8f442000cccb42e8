#include "trainer/device/torch_info.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <sstream>

namespace partrain {

std::string torch_version() { return TORCH_VERSION; }

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

std::string describe_torch() {
  std::ostringstream out;
  out << "libtorch: " << torch_version() << "\n";
  int devices = cuda_device_count();
  out << "cuda: " << (torch::cuda::is_available() ? "available, " : "not available, ") << devices
      << " device(s)\n";
  return out.str();
}

}  // namespace partrain
