// defines: SyncBatchNorm2d and sync_batchnorm_layers() — BatchNorm whose batch statistics,
// and in backward the sums the input gradient needs, are reduced over every rank, as
// torch.nn.SyncBatchNorm does. See Note [SyncBatchNorm] in sync_batchnorm.cpp.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include "trainer/model/models.h"

namespace partrain {

namespace comm {
class Communicator;
}

// Holds what BatchNorm2d holds, under the same names (weight, bias, running_mean,
// running_var, num_batches_tracked), so checkpoints do not change. In training mode the
// mean and variance are those of the whole global batch; in eval mode it normalises with the
// running statistics and does not communicate. `comm` must outlive the module and serve only
// it (and other SyncBatchNorm layers of the same model): see the note on why.
class SyncBatchNorm2dImpl : public torch::nn::Cloneable<SyncBatchNorm2dImpl> {
 public:
  SyncBatchNorm2dImpl(const torch::nn::BatchNormOptions& options, comm::Communicator* comm);

  void reset() override;
  at::Tensor forward(const at::Tensor& input);

  const torch::nn::BatchNormOptions& options() const { return options_; }

  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  torch::nn::BatchNormOptions options_;
  comm::Communicator* comm_;
};
TORCH_MODULE(SyncBatchNorm2d);

// For make_model: SyncBatchNorm2d layers over `comm` wherever the model has BatchNorm, under
// the same names and with BatchNorm2d's initial state.
NormLayer sync_batchnorm_layers(comm::Communicator& comm);

}  // namespace partrain
