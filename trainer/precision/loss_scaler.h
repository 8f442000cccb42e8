// defines: LossScaler and LossScalerState — precision f16's dynamic loss scale, as PyTorch's
// torch.cuda.amp.GradScaler: the loss is multiplied by the scale before backward so that
// small f16 gradients do not flush to zero; before the optimizer step the gradients are
// divided by it again. A step whose gradients hold an inf or a NaN is skipped and the scale
// halved; after growth_interval good steps in a row it doubles.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace at {
class Tensor;
}
namespace c10 {
struct Device;
}

namespace partrain {

namespace comm {
class Communicator;
}

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

class LossScaler {
 public:
  // enabled=false: scale 1, every step taken, nothing checked.
  LossScaler(bool enabled, LossScalerOptions options = {});

  bool enabled() const { return enabled_; }
  at::Tensor scale(const at::Tensor& loss) const;

  // After the gradients are averaged over the ranks: divides them by the scale and says
  // whether every one is finite. The verdict is reduced over the ranks (max of "found an
  // inf"), so all ranks skip or take a step together even if their gradients differed.
  bool unscale_and_check(const std::vector<at::Tensor>& parameters, comm::Communicator* comm,
                         const c10::Device& device);
  // After the step (or the skip): the scale's next value.
  void update(bool finite);

  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state) { state_ = state; }

 private:
  bool enabled_;
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace partrain
