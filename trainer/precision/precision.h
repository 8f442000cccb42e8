// defines: PrecisionPlugin and AutocastScope —
// train.precision as one piece, the way a training step meets it: the context its forward
// passes run in (autocast to bf16 or f16), the loss it sends into backward (multiplied by the
// dynamic loss scale for f16), and whether the step may be taken (the gradients unscaled and
// checked for infs; the strategy makes every rank agree on the verdict). The loss scale follows
// PyTorch's GradScaler: a step whose gradients hold an inf or a NaN is skipped and the scale
// halved; after growth_interval good steps in a row it doubles.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/config_enums.h"
#include "trainer/precision/loss_scale.h"

namespace at {
class Tensor;
}

namespace partrain {

// Forward passes inside it run under LibTorch's autocast for bf16 or f16: the ops that
// tolerate it (convolutions, matrix products) in the lower precision, the others, and the
// parameters, in f32. For f32 it does nothing.
class AutocastScope {
 public:
  // Throws UsageError for f16 on the CPU (LibTorch's CPU autocast knows only bf16).
  AutocastScope(Precision precision, const c10::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;  // whose autocast state it set
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Float;
};

class PrecisionPlugin {
 public:
  // What train.precision asks for: f32 nothing, bf16 autocast, f16 autocast and the dynamic
  // loss scale. Throws UsageError where `precision` cannot run on `device` (f16 on the CPU).
  static PrecisionPlugin for_training(Precision precision, const c10::Device& device);

  // The two parts chosen apart: `autocast` for the forward, `loss_scaling` for backward and
  // the step (for_training() ties them; a test can ask for the loss scale on the CPU alone).
  PrecisionPlugin(Precision autocast, bool loss_scaling, const c10::Device& device,
                  LossScalerOptions scaler = {});

  Precision autocast() const { return autocast_; }
  bool loss_scaling() const { return loss_scaling_; }

  // The scope a forward pass runs in: `auto scope = precision.forward_context();`.
  AutocastScope forward_context() const { return AutocastScope(autocast_, device_); }
  // The loss that goes into backward: multiplied by the scale with loss scaling.
  at::Tensor scale_loss(const at::Tensor& loss) const;

  // With loss scaling, after the gradients are averaged over the ranks: divides `gradients`
  // (undefined ones are skipped) by the scale and returns a one-element f32 tensor on the
  // device, 1 where some gradient holds an inf or a NaN, else 0. The strategy reduces it over
  // the ranks (max), so that all ranks skip or take a step together even where each holds
  // other gradients (a shard of them).
  at::Tensor unscale_and_find_inf(const std::vector<at::Tensor>& gradients) const;
  // After the step (or the skip): the scale's next value.
  void update(bool finite);

  // The loss scale, for checkpoints: nullopt without loss scaling.
  std::optional<LossScalerState> state() const;
  // Takes a checkpoint's loss scale; ignored without loss scaling (or without a saved state).
  void restore(const std::optional<LossScalerState>& state);

 private:
  Precision autocast_;
  bool loss_scaling_;
  c10::Device device_;
  LossScalerOptions options_;
  LossScalerState state_;
};

// Throws UsageError when `precision` cannot run on `device` (f16 on the CPU).
void check_precision_supported(Precision precision, const c10::Device& device);

// False on an x86 CPU without AVX-512 BW, VL and DQ: LibTorch then runs bf16 convolutions
// with its slow reference kernels instead of oneDNN's (the same test as LibTorch's own
// mkldnn_bf16_device_check). True elsewhere, where this is not known.
bool cpu_has_onednn_bf16();

// A line for the user when `precision` will run much slower than f32 on `device` (bf16 on a
// CPU without cpu_has_onednn_bf16()); "" otherwise.
std::string precision_note(Precision precision, const c10::Device& device);

}  // namespace partrain
