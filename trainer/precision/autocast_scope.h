// defines: AutocastScope — train.precision bf16 or f16 for the forward passes inside it:
// LibTorch's autocast runs the ops that tolerate it (convolutions, matrix products) in the
// lower precision and keeps the others, and the parameters, in f32.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "trainer/config/config_enums.h"

namespace partrain {

class AutocastScope {
 public:
  // precision f32: does nothing. bf16 on CUDA or CPU; f16 on CUDA only (throws UsageError on
  // the CPU, where LibTorch's autocast knows only bf16).
  AutocastScope(Precision precision, const c10::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Float;
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
