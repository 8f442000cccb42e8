// defines: describe_torch() — LibTorch version and CUDA availability, without LibTorch headers.
#pragma once

#include <string>

namespace partrain {

// Lines "libtorch: 1.13.0\ncuda: ...\n" for `partrain version` and the run report.
std::string describe_torch();
std::string torch_version();
int cuda_device_count();

}  // namespace partrain
