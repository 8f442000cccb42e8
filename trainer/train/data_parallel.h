// defines: data_parallel_forward() — strategy dp: one forward of a module replicated over
// several devices of this process. See Note [DataParallel] in data_parallel.cpp.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace torch::nn {
class SequentialImpl;
}

namespace partrain {

// Splits `input` along dim 0 over `devices` (fewer when the batch is smaller), runs a
// replica of `module` on each piece and returns the outputs concatenated on `output_device`.
// `module` must live on devices[0]; it is the replica there, so its buffers (BatchNorm
// running statistics) advance with that device's piece of every training batch, and the
// gradients of every replica reach its parameters. Works on any device type, CPU included.
at::Tensor data_parallel_forward(torch::nn::SequentialImpl& module, const at::Tensor& input,
                                 const std::vector<c10::Device>& devices,
                                 const c10::Device& output_device);

}  // namespace partrain
