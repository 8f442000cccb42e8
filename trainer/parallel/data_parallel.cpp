// Note [DataParallel]
// -------------------
// What Python's nn.DataParallel does, in one process:
//
//   input --split--+--> piece 0 -> the module itself (devices[0]) --+   (even, or by weights)
//                  +--> piece 1 -> replica 1 (devices[1])          --+--> cat on the
//                  +--> ...                                         --+    output device
//
// Replicas 1.. are fresh deep copies for every forward (parameters and buffers as they are
// now). Their parameters are then given a gradient edge back to the module's own parameter:
// one node per parameter that, in backward, sums the gradients of every replica onto the
// module's device and hands them to the parameter's gradient accumulator. Piece 0 goes
// through the module itself, so its buffers are the ones that advance: BatchNorm running
// statistics end up those of device 0's share of each batch, as in Python (whose replica 0
// shares the module's buffers). LibTorch's own data_parallel() deep-copies the module for
// every device, device 0 included, and wires back only gradients, so there the statistics
// never move from their initial values and evaluation normalises with mean 0, variance 1.
//
// The replicas run one after another on this thread: on CUDA each forward only queues
// kernels on its device, so the devices compute side by side while the next one is queued,
// and grad mode and the other thread-local settings stay the caller's.
#include "trainer/parallel/data_parallel.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "common/errors.h"
#include "trainer/data/balance.h"

namespace partrain {
namespace {

// Backward of replication for one parameter: input i is replica i's gradient.
class SumReplicaGradients : public torch::autograd::Node {
 public:
  explicit SumReplicaGradients(c10::Device device) : device_(device) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    at::Tensor sum;
    for (const auto& grad : grads) {
      if (!grad.defined()) continue;  // that replica's forward did not reach the parameter
      at::Tensor here = grad.to(device_);
      sum = sum.defined() ? sum + here : here;
    }
    return {sum};
  }

  std::string name() const override { return "partrain::SumReplicaGradients"; }

 private:
  c10::Device device_;
};

}  // namespace

at::Tensor data_parallel_forward(
    const std::vector<at::Tensor>& parameters,
    const std::function<at::Tensor(const at::Tensor&)>& forward,
    const std::function<DataParallelReplica(const c10::Device&)>& replicate,
    const at::Tensor& input, const std::vector<c10::Device>& devices,
    const c10::Device& output_device, const std::vector<double>& weights) {
  PARTRAIN_CHECK(!devices.empty(), Error, "DataParallel over no devices");
  PARTRAIN_CHECK(weights.empty() || weights.size() == devices.size(), Error,
                 "DataParallel: ", weights.size(), " weights for ", devices.size(), " devices");
  for (const auto& p : parameters) {
    PARTRAIN_CHECK(p.device() == devices[0], Error, "DataParallel: the model is on ",
                   p.device().str(), ", not on the first of its devices, ", devices[0].str());
  }
  if (devices.size() == 1) return forward(input.to(devices[0])).to(output_device);

  // Each device's piece: `on[k]` runs pieces[k].
  std::vector<at::Tensor> pieces;
  std::vector<std::size_t> on;
  if (weights.empty()) {
    pieces = input.chunk(static_cast<int64_t>(devices.size()), 0);
    for (std::size_t k = 0; k < pieces.size(); ++k) on.push_back(k);
  } else {
    const std::vector<std::int64_t> sizes = data::proportional_split(input.size(0), weights);
    std::int64_t first = 0;
    for (std::size_t k = 0; k < sizes.size(); first += sizes[k], ++k) {
      if (sizes[k] == 0) continue;
      pieces.push_back(input.narrow(0, first, sizes[k]));
      on.push_back(k);
    }
  }
  std::vector<DataParallelReplica> replicas;  // replicas[k - 1] on devices[k], where used
  for (std::size_t k = 1; k < devices.size(); ++k) {
    if (std::find(on.begin(), on.end(), k) == on.end()) {
      replicas.push_back({});
      continue;
    }
    replicas.push_back(replicate(devices[k]));
    const auto& theirs = replicas.back().parameters;
    PARTRAIN_CHECK(theirs.size() == parameters.size(), Error, "DataParallel: a replica has ",
                   theirs.size(), " parameters, the model ", parameters.size());
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      PARTRAIN_CHECK(theirs[i].sizes() == parameters[i].sizes(), Error,
                     "DataParallel: replica parameter ", i, " has shape ", theirs[i].sizes(),
                     " where the model's has ", parameters[i].sizes());
    }
  }

  if (torch::autograd::GradMode::is_enabled()) {
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      const at::Tensor& original = parameters[i];
      if (!original.requires_grad()) continue;
      auto node = std::make_shared<SumReplicaGradients>(original.device());
      node->set_next_edges(torch::autograd::collect_next_edges(original));
      for (auto& replica : replicas) {
        if (!replica.parameters.empty()) torch::autograd::set_history(replica.parameters[i], node);
      }
    }
  }

  std::vector<at::Tensor> outputs;
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    const std::size_t k = on[p];
    const at::Tensor piece = pieces[p].to(devices[k]);
    outputs.push_back((k == 0 ? forward(piece) : replicas[k - 1].forward(piece)).to(output_device));
  }
  return at::cat(outputs, 0);
}

at::Tensor data_parallel_forward(torch::nn::SequentialImpl& module, const at::Tensor& input,
                                 const std::vector<c10::Device>& devices,
                                 const c10::Device& output_device,
                                 const std::vector<double>& weights) {
  return data_parallel_forward(
      module.parameters(), [&module](const at::Tensor& x) { return module.forward(x); },
      [&module](const c10::Device& device) { return replicate_sequential(module, device); }, input,
      devices, output_device, weights);
}

at::Tensor data_parallel_forward(TrainModel& model, const at::Tensor& input,
                                 const std::vector<c10::Device>& devices,
                                 const c10::Device& output_device,
                                 const std::vector<double>& weights) {
  return data_parallel_forward(
      model.module().parameters(), [&model](const at::Tensor& x) { return model.forward(x); },
      [&model](const c10::Device& device) { return model.replicate(device); }, input, devices,
      output_device, weights);
}

}  // namespace partrain
