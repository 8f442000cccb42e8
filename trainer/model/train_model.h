// defines: TrainModel — the network one rank trains, whatever built it: a built-in
// Sequential (make_model) or a module saved from Python. The training loop, the Reducer and
// the checkpoints see only this face.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/model/models.h"

namespace torch::nn {
class Module;
}

namespace partrain {

// A copy of a model placed on another device (strategy dp, Note [DataParallel]): its forward,
// and its parameters in the order of the model's own, each a leaf of its own that the
// gradients are wired back from.
struct DataParallelReplica {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> parameters;
};

class TrainModel {
 public:
  virtual ~TrainModel() = default;

  // The parameters and buffers, under the names Python gives them ("conv1.weight"): what the
  // optimizer steps, the Reducer averages and a checkpoint's "model" state dict holds.
  // train(), eval() and to(device) on it reach the whole network.
  virtual torch::nn::Module& module() = 0;
  const torch::nn::Module& module() const { return const_cast<TrainModel*>(this)->module(); }

  // A batch of images [N, C, H, W] to logits [N, num_classes].
  virtual at::Tensor forward(const at::Tensor& images) = 0;

  // strategy dp: a fresh copy of the model (parameters and buffers as they are now) on
  // `device`, for one forward (parallel/data_parallel.h).
  virtual DataParallelReplica replicate(const c10::Device& device) = 0;
};

// The replica of a built-in model: a deep copy, its parameters matched by position.
DataParallelReplica replicate_sequential(torch::nn::SequentialImpl& module,
                                         const c10::Device& device);

// The model `config` names, for images of `shape`, on the CPU: model.torchscript's module
// (load_torchscript_model, which checks it), else a built-in one. `norm`: the normalisation
// layer of a built-in model (model.sync_batchnorm passes SyncBatchNorm's,
// parallel/sync_batchnorm.h); a TorchScript module brings its own, so `norm` must be unset.
std::unique_ptr<TrainModel> make_train_model(const ModelConfig& config, const ModelShape& shape,
                                             const NormLayer& norm = nullptr);

}  // namespace partrain
