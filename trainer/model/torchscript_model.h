// defines: load_torchscript_model() — model.torchscript: a module saved from Python with
// torch.jit.script or torch.jit.trace, checked on a probe batch, as a TrainModel. See
// Note [TorchScript model] in torchscript_model.cpp.
#pragma once

#include <memory>
#include <string>

#include "trainer/model/models.h"
#include "trainer/model/train_model.h"

namespace partrain {

// Loads `path` onto the CPU and checks it before anything trains: the file must be a
// TorchScript archive, the module must have parameters (none shared between two names), and
// its forward, in training mode, must map a batch [N, C, H, W] of `shape` to [N,
// num_classes] floating-point logits that depend on the parameters, with a backward that
// runs. Any of these failing is a UsageError (exit 2) of one line naming the file and what
// is wrong. The probe runs on a copy, so the module's buffers are as they were saved.
std::unique_ptr<TrainModel> load_torchscript_model(const std::string& path,
                                                   const ModelShape& shape);

}  // namespace partrain
