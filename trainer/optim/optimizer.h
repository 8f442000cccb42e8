// defines: make_optimizer() — the optimizer train.optimizer names (sgd, adamw) over a list of
// tensors — and ReplicatedOptimizer, that optimizer over every parameter of a model, whole on
// this rank (strategies single, dp and unsharded ddp): its clipped step and its state as a
// checkpoint's "optimizer" entry.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/optim/optimizer_state.h"

namespace c10 {
struct IValue;
}
namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace partrain {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        std::vector<at::Tensor> parameters);

// The optimizer's "name" in a checkpoint: "sgd" or "adamw".
std::string optimizer_name(OptimizerName name);

// What `optimizer` (of kind `name`) holds for `parameter`, its tensors as they are (not copied).
ParamState state_of(const torch::optim::Optimizer& optimizer, OptimizerName name,
                    const at::Tensor& parameter);
// Gives `parameter` the state `state` (moved to the parameter's device); nothing when it holds
// no tensors. Throws UsageError naming `path` when adamw's step or a tensor is missing or a
// tensor's length differs from the parameter's.
void set_state(torch::optim::Optimizer& optimizer, OptimizerName name, const at::Tensor& parameter,
               const ParamState& state, const std::string& path);
// Gives each tensor `optimizer` steps that has no state yet the state LibTorch's step would make
// for it at the first step (AdamW's zero moments at step 0, SGD's momentum buffer); training is
// the same to the bit. make_optimizer() calls it, and a load after it has put the saved state in.
void allocate_state(torch::optim::Optimizer& optimizer, OptimizerName name);
// Bytes of every state tensor `optimizer` holds (the memory account).
std::int64_t state_bytes(const torch::optim::Optimizer& optimizer);

class ReplicatedOptimizer {
 public:
  // Over every parameter of `model`, in its order; the names are the checkpoint's keys.
  ReplicatedOptimizer(const OptimizerConfig& config, const torch::nn::Module& model);
  ~ReplicatedOptimizer();
  ReplicatedOptimizer(const ReplicatedOptimizer&) = delete;
  ReplicatedOptimizer& operator=(const ReplicatedOptimizer&) = delete;

  // Each parameter's .grad (undefined where it has none).
  std::vector<at::Tensor> gradients() const;
  // Scales the gradients so that their global L2 norm is at most `clip_grad_norm` (0: off), as
  // torch.nn.utils.clip_grad_norm_ does, then steps at rate `lr`.
  void step(double lr, double clip_grad_norm);
  void zero_grad();

  // The checkpoint's "optimizer" entry: {"name": "sgd" | "adamw", "state": {parameter name:
  // {"momentum_buffer"} | {"step", "exp_avg", "exp_avg_sq"[, "max_exp_avg_sq"]}}}, tensors on
  // the CPU (copies only where the state lives on a device).
  c10::IValue save() const;
  // Takes a checkpoint's state, whole or in shards of a sharded run of any world size. Throws
  // UsageError naming the file when it is of another optimizer or does not fit the parameters.
  void load(const SavedOptimizerState& saved);

  std::int64_t state_bytes() const { return partrain::state_bytes(*optimizer_); }

 private:
  OptimizerName name_;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;  // by name, in the model's order
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace partrain
