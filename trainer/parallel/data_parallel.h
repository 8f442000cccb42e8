// defines: data_parallel_forward() — strategy dp: one forward of a module replicated over
// several devices of this process. See Note [DataParallel] in data_parallel.cpp.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <vector>

#include "trainer/model/train_model.h"

namespace partrain {

// Splits `input` along dim 0 over `devices` (fewer when the batch is smaller), runs a
// replica of `module` on each piece and returns the outputs concatenated on `output_device`.
// `weights` (one > 0 per device; empty: even pieces) sizes the pieces in proportion, by
// largest remainder (data.balance under strategy dp); a device whose piece rounds to 0 sits
// the batch out. The outputs are the input's rows in order whatever the split, so a loss over
// them is the same function of the parameters.
// `module` must live on devices[0]; it is the replica there, so its buffers (BatchNorm
// running statistics) advance with that device's piece of every training batch, and the
// gradients of every replica reach its parameters. Works on any device type, CPU included.
at::Tensor data_parallel_forward(torch::nn::SequentialImpl& module, const at::Tensor& input,
                                 const std::vector<c10::Device>& devices,
                                 const c10::Device& output_device,
                                 const std::vector<double>& weights = {});

// The same for any TrainModel: its replicate() makes the copies.
at::Tensor data_parallel_forward(TrainModel& model, const at::Tensor& input,
                                 const std::vector<c10::Device>& devices,
                                 const c10::Device& output_device,
                                 const std::vector<double>& weights = {});

// The same for a model of any kind: `parameters` are the model's own (on devices[0]),
// `forward` runs the model itself, `replicate(device)` makes a fresh copy on `device` whose
// parameters the gradients are then wired back from.
at::Tensor data_parallel_forward(
    const std::vector<at::Tensor>& parameters,
    const std::function<at::Tensor(const at::Tensor&)>& forward,
    const std::function<DataParallelReplica(const c10::Device&)>& replicate,
    const at::Tensor& input, const std::vector<c10::Device>& devices,
    const c10::Device& output_device, const std::vector<double>& weights = {});

}  // namespace partrain
