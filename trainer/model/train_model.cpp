#include "trainer/model/train_model.h"

#include <torch/nn/modules/container/sequential.h>

#include "common/errors.h"
#include "trainer/model/torchscript_model.h"

namespace partrain {
namespace {

// The built-in models: a Sequential whose children carry the parameter names.
class SequentialModel final : public TrainModel {
 public:
  explicit SequentialModel(torch::nn::Sequential net) : net_(std::move(net)) {}

  torch::nn::Module& module() override { return *net_; }
  at::Tensor forward(const at::Tensor& images) override { return net_->forward(images); }
  DataParallelReplica replicate(const c10::Device& device) override {
    return replicate_sequential(*net_, device);
  }

 private:
  torch::nn::Sequential net_;
};

}  // namespace

DataParallelReplica replicate_sequential(torch::nn::SequentialImpl& module,
                                         const c10::Device& device) {
  auto replica = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module.clone(device));
  PARTRAIN_CHECK(replica != nullptr, Error,
                 "DataParallel: the model did not clone as a Sequential");
  replica->train(module.is_training());
  // Sequential's clone numbers its children ("0.weight" for "conv1.weight"), so its
  // parameters are matched to the model's by position (and checked by shape).
  return DataParallelReplica{[replica](const at::Tensor& x) { return replica->forward(x); },
                             replica->parameters()};
}

std::unique_ptr<TrainModel> make_train_model(const ModelConfig& config, const ModelShape& shape,
                                             const NormLayer& norm) {
  if (!config.torchscript.empty()) {
    PARTRAIN_CHECK(norm == nullptr, UsageError,
                   "model.sync_batchnorm is not available with model.torchscript");
    return load_torchscript_model(config.torchscript, shape);
  }
  return std::make_unique<SequentialModel>(make_model(config, shape, norm));
}

}  // namespace partrain
