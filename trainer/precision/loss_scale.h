// defines: LossScalerState and LossScalerOptions — precision f16's dynamic loss scale as
// numbers, without LibTorch, for the checkpoint's meta (PrecisionPlugin in precision.h
// applies them).
#pragma once

#include <cstdint>

namespace partrain {

struct LossScalerState {
  double scale = 65536.0;
  std::int64_t good_steps = 0;  // finite steps since the scale last changed
};

struct LossScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

}  // namespace partrain
