// defines: TrainModel — the network one rank trains, whatever built it: a built-in
// Sequential (make_model) or a module saved from Python. The training loop, the Reducer and
// the checkpoints see only this face.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/model/models.h"

namespace torch::nn {
class Module;
}

namespace partrain {

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

  // strategy dp: the batch split over `devices` (evenly, or in proportion to `weights`), a
  // replica on each, the outputs gathered on `output_device` (see data_parallel.h).
  virtual at::Tensor forward_data_parallel(const at::Tensor& images,
                                           const std::vector<c10::Device>& devices,
                                           const c10::Device& output_device,
                                           const std::vector<double>& weights) = 0;
};

namespace comm {
class Communicator;
}

// The model `config` names, for images of `shape`, on the CPU: model.torchscript's module
// (load_torchscript_model, which checks it), else a built-in one. With `batchnorm_comm`
// (model.sync_batchnorm under ddp), its BatchNorm layers become SyncBatchNorm over that
// communicator, which must outlive the model and serve nothing else (sync_batchnorm.cpp).
std::unique_ptr<TrainModel> make_train_model(const ModelConfig& config, const ModelShape& shape,
                                             comm::Communicator* batchnorm_comm = nullptr);

}  // namespace partrain
