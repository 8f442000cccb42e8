#include "trainer/model/train_model.h"

#include <torch/nn/modules/container/sequential.h>

#include "common/errors.h"
#include "trainer/parallel/data_parallel.h"
#include "trainer/parallel/sync_batchnorm.h"
#include "trainer/model/torchscript_model.h"

namespace partrain {
namespace {

// The built-in models: a Sequential whose children carry the parameter names.
class SequentialModel final : public TrainModel {
 public:
  explicit SequentialModel(torch::nn::Sequential net) : net_(std::move(net)) {}

  torch::nn::Module& module() override { return *net_; }
  at::Tensor forward(const at::Tensor& images) override { return net_->forward(images); }
  at::Tensor forward_data_parallel(const at::Tensor& images,
                                   const std::vector<c10::Device>& devices,
                                   const c10::Device& output_device,
                                   const std::vector<double>& weights) override {
    return data_parallel_forward(*net_, images, devices, output_device, weights);
  }

 private:
  torch::nn::Sequential net_;
};

}  // namespace

std::unique_ptr<TrainModel> make_train_model(const ModelConfig& config, const ModelShape& shape,
                                             comm::Communicator* batchnorm_comm) {
  if (!config.torchscript.empty()) {
    PARTRAIN_CHECK(batchnorm_comm == nullptr, UsageError,
                   "model.sync_batchnorm is not available with model.torchscript");
    return load_torchscript_model(config.torchscript, shape);
  }
  torch::nn::Sequential net = make_model(
      config, shape, batchnorm_comm != nullptr ? sync_batchnorm_layers(*batchnorm_comm) : nullptr);
  return std::make_unique<SequentialModel>(std::move(net));
}

}  // namespace partrain
