#include "trainer/precision/loss_scaler.h"

#include <ATen/ATen.h>

#include "comm_backends/communicator.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {

LossScaler::LossScaler(bool enabled, LossScalerOptions options)
    : enabled_(enabled), options_(options) {
  state_.scale = enabled ? options.init_scale : 1.0;
}

at::Tensor LossScaler::scale(const at::Tensor& loss) const {
  return enabled_ ? loss * state_.scale : loss;
}

bool LossScaler::unscale_and_check(const std::vector<at::Tensor>& parameters,
                                   comm::Communicator* comm, const c10::Device& device) {
  if (!enabled_) return true;
  at::NoGradGuard no_grad;
  const double inverse = 1.0 / state_.scale;
  std::vector<at::Tensor> finite;
  for (const auto& p : parameters) {
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    g.mul_(inverse);
    finite.push_back(at::isfinite(g).all());
  }
  // One flag, one device-to-host copy: 1 where some gradient is not finite.
  at::Tensor found_inf =
      finite.empty()
          ? at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device))
          : at::logical_not(at::stack(finite).all()).to(at::kFloat).reshape({1}).to(device);
  if (comm != nullptr && comm->size() > 1) {
    allreduce_tensor(*comm, found_inf, comm::ReduceOp::max);
  }
  return found_inf.cpu().item<float>() == 0.0f;
}

void LossScaler::update(bool finite) {
  if (!enabled_) return;
  if (!finite) {
    state_.scale *= options_.backoff_factor;
    state_.good_steps = 0;
    return;
  }
  if (++state_.good_steps == options_.growth_interval) {
    state_.scale *= options_.growth_factor;
    state_.good_steps = 0;
  }
}

}  // namespace partrain
