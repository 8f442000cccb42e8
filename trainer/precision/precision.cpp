#include "trainer/precision/precision.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "common/errors.h"

namespace partrain {
namespace {

// LibTorch 2.4 keyed autocast's state by device type and deprecated the per-device functions
// (is_enabled() for CUDA, is_cpu_enabled(), ...) that 1.13, Debian's, has alone.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
void set_autocast_enabled(c10::DeviceType type, bool on) {
  at::autocast::set_autocast_enabled(type, on);
}
c10::ScalarType autocast_dtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
bool autocast_enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                       : at::autocast::is_cpu_enabled();
}
void set_autocast_enabled(c10::DeviceType type, bool on) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
c10::ScalarType autocast_dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                       : at::autocast::get_autocast_cpu_dtype();
}
void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

}  // namespace

void check_precision_supported(Precision precision, const c10::Device& device) {
  PARTRAIN_CHECK(precision != Precision::kF16 || device.is_cuda(), UsageError,
                 "train.precision f16 needs a CUDA device, and this rank trains on the CPU "
                 "(LibTorch's autocast runs the CPU in bf16 only): use precision bf16 or f32");
}

bool cpu_has_onednn_bf16() {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return true;
#endif
}

std::string precision_note(Precision precision, const c10::Device& device) {
  if (precision != Precision::kBf16 || !device.is_cpu() || cpu_has_onednn_bf16()) return "";
  return "note: train.precision bf16 on a CPU without AVX-512 (BW, VL, DQ): LibTorch runs bf16 "
         "convolutions here with its slow reference kernels, not oneDNN's, so expect training "
         "to be several times slower than with f32 (BENCHMARKS.md, \"precision bf16\")";
}

AutocastScope::AutocastScope(Precision precision, const c10::Device& device) {
  if (precision == Precision::kF32) return;
  check_precision_supported(precision, device);
  const c10::ScalarType dtype =
      precision == Precision::kBf16 ? c10::ScalarType::BFloat16 : c10::ScalarType::Half;
  active_ = true;
  type_ = device.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  was_enabled_ = autocast_enabled(type_);
  previous_dtype_ = autocast_dtype(type_);
  set_autocast_dtype(type_, dtype);
  set_autocast_enabled(type_, true);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // The casts of the weights are cached for the scope; the next scope sees updated weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(type_, was_enabled_);
  set_autocast_dtype(type_, previous_dtype_);
}

PrecisionPlugin PrecisionPlugin::for_training(Precision precision, const c10::Device& device) {
  check_precision_supported(precision, device);
  return PrecisionPlugin(precision, precision == Precision::kF16, device);
}

PrecisionPlugin::PrecisionPlugin(Precision autocast, bool loss_scaling, const c10::Device& device,
                                 LossScalerOptions scaler)
    : autocast_(autocast), loss_scaling_(loss_scaling), device_(device), options_(scaler) {
  state_.scale = loss_scaling ? options_.init_scale : 1.0;
}

at::Tensor PrecisionPlugin::scale_loss(const at::Tensor& loss) const {
  return loss_scaling_ ? loss * state_.scale : loss;
}

at::Tensor PrecisionPlugin::unscale_and_find_inf(const std::vector<at::Tensor>& gradients) const {
  at::NoGradGuard no_grad;
  const double inverse = 1.0 / state_.scale;
  std::vector<at::Tensor> finite;
  for (const at::Tensor& g : gradients) {
    if (!g.defined()) continue;
    g.mul_(inverse);
    finite.push_back(at::isfinite(g).all());
  }
  // One flag: 1 where some gradient is not finite.
  return finite.empty()
             ? at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_))
             : at::logical_not(at::stack(finite).all()).to(at::kFloat).reshape({1}).to(device_);
}

void PrecisionPlugin::update(bool finite) {
  if (!loss_scaling_) return;
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

std::optional<LossScalerState> PrecisionPlugin::state() const {
  if (!loss_scaling_) return std::nullopt;
  return state_;
}

void PrecisionPlugin::restore(const std::optional<LossScalerState>& state) {
  if (loss_scaling_ && state) state_ = *state;
}

}  // namespace partrain
