#include "trainer/optim/optimizer.h"

#include <ATen/core/ivalue.h>
#include <cstdint>
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "common/errors.h"

namespace partrain {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& cfg,
                                                        std::vector<at::Tensor> parameters) {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (cfg.name == OptimizerName::kAdamW) {
    optimizer = std::make_unique<torch::optim::AdamW>(
        std::move(parameters), torch::optim::AdamWOptions(cfg.lr)
                                   .betas(std::make_tuple(cfg.beta1, cfg.beta2))
                                   .eps(cfg.eps)
                                   .weight_decay(cfg.weight_decay));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(std::move(parameters),
                                                    torch::optim::SGDOptions(cfg.lr)
                                                        .momentum(cfg.momentum)
                                                        .nesterov(cfg.nesterov)
                                                        .weight_decay(cfg.weight_decay));
  }
  allocate_state(*optimizer, cfg.name);
  return optimizer;
}

std::string optimizer_name(OptimizerName name) {
  return name == OptimizerName::kAdamW ? "adamw" : "sgd";
}

namespace {

// The optimizer's state is keyed by parameter identity in LibTorch; in the file, by the
// parameter's name, so that it survives a restart and reads naturally in Python.
std::string state_key(const at::Tensor& parameter) {
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
}

}  // namespace

ReplicatedOptimizer::ReplicatedOptimizer(const OptimizerConfig& config,
                                         const torch::nn::Module& model)
    : name_(config.name) {
  std::vector<at::Tensor> tensors;
  for (const auto& item : model.named_parameters()) {
    parameters_.emplace_back(item.key(), item.value());
    // A frozen parameter is never stepped; given to the optimizer it would get a state.
    if (item.value().requires_grad()) tensors.push_back(item.value());
  }
  optimizer_ = make_optimizer(config, std::move(tensors));
}

ReplicatedOptimizer::~ReplicatedOptimizer() = default;

std::vector<at::Tensor> ReplicatedOptimizer::gradients() const {
  std::vector<at::Tensor> out;
  out.reserve(parameters_.size());
  for (const auto& [name, p] : parameters_) out.push_back(p.grad());
  return out;
}

void ReplicatedOptimizer::step(double lr, double clip_grad_norm) {
  if (clip_grad_norm > 0) {
    std::vector<at::Tensor> parameters;
    for (const auto& [name, p] : parameters_) parameters.push_back(p);
    torch::nn::utils::clip_grad_norm_(parameters, clip_grad_norm);
  }
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(lr);
  optimizer_->step();
}

void ReplicatedOptimizer::zero_grad() { optimizer_->zero_grad(); }

c10::IValue ReplicatedOptimizer::save() const {
  c10::impl::GenericDict per_parameter(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, p] : parameters_) {
    const ParamState state = state_of(*optimizer_, name_, p);
    if (state.tensors.empty()) continue;
    c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
    if (state.step) entry.insert("step", *state.step);
    for (const auto& [name, t] : state.tensors) entry.insert(name, t.detach().cpu());
    per_parameter.insert(key, entry);
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("name", optimizer_name(name_));
  dict.insert("state", per_parameter);
  return dict;
}

void ReplicatedOptimizer::load(const SavedOptimizerState& saved) {
  saved.check_optimizer(name_);
  // The zeros made with the optimizer go before the saved state is read into memory, which
  // then takes their place; parameters the file holds no state for get zeros again below.
  optimizer_->state().clear();
  StateAssembly assembly(saved.path());
  for (std::size_t k = 0; k < parameters_.size(); ++k) {
    const at::Tensor& p = parameters_[k].second;
    const std::size_t d =
        assembly.add_destination(p.numel(), p.options().device(at::kCPU).requires_grad(false));
    assembly.add_region(parameters_[k].first, d, 0, 0, p.numel());
  }
  saved.for_each_piece([&](const StatePiece& piece) { assembly.take(piece); });
  for (std::size_t k = 0; k < parameters_.size(); ++k) {
    ParamState state = assembly.result(k);
    for (auto& [key, t] : state.tensors) t = t.view(parameters_[k].second.sizes());
    set_state(*optimizer_, name_, parameters_[k].second, state, saved.path());
  }
  allocate_state(*optimizer_, name_);
}

ParamState state_of(const torch::optim::Optimizer& optimizer, OptimizerName name,
                    const at::Tensor& parameter) {
  ParamState out;
  const auto& state = optimizer.state();
  auto it = state.find(state_key(parameter));
  if (it == state.end()) return out;
  if (name == OptimizerName::kSgd) {
    const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*it->second);
    if (sgd.momentum_buffer().defined()) out.tensors["momentum_buffer"] = sgd.momentum_buffer();
  } else {
    const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out.step = adamw.step();
    out.tensors["exp_avg"] = adamw.exp_avg();
    out.tensors["exp_avg_sq"] = adamw.exp_avg_sq();
    if (adamw.max_exp_avg_sq().defined()) out.tensors["max_exp_avg_sq"] = adamw.max_exp_avg_sq();
  }
  return out;
}

void set_state(torch::optim::Optimizer& optimizer, OptimizerName name, const at::Tensor& parameter,
               const ParamState& state, const std::string& path) {
  if (state.tensors.empty()) return;
  auto tensor = [&](const char* key) {
    auto it = state.tensors.find(key);
    PARTRAIN_CHECK(it != state.tensors.end(), UsageError, "checkpoint ", path,
                   ": an optimizer state has no ", key);
    PARTRAIN_CHECK(it->second.numel() == parameter.numel(), UsageError, "checkpoint ", path,
                   ": an optimizer state does not fit its parameter");
    return it->second.reshape(parameter.sizes()).to(parameter.device());
  };
  if (name == OptimizerName::kSgd) {
    auto sgd = std::make_unique<torch::optim::SGDParamState>();
    sgd->momentum_buffer(tensor("momentum_buffer"));
    optimizer.state()[state_key(parameter)] = std::move(sgd);
    return;
  }
  PARTRAIN_CHECK(state.step.has_value(), UsageError, "checkpoint ", path,
                 ": an optimizer state has no step");
  auto adamw = std::make_unique<torch::optim::AdamWParamState>();
  adamw->step(*state.step);
  adamw->exp_avg(tensor("exp_avg"));
  adamw->exp_avg_sq(tensor("exp_avg_sq"));
  if (state.tensors.count("max_exp_avg_sq") > 0) adamw->max_exp_avg_sq(tensor("max_exp_avg_sq"));
  optimizer.state()[state_key(parameter)] = std::move(adamw);
}

// Made with the optimizer, the state lies in memory below everything a step allocates and
// frees. Made inside the first step, as LibTorch does, it takes the place of blocks that step
// freed, and the later steps' activations no longer fit where the first step's were (measured,
// resnet18 width 128 with AdamW, two ranks unsharded: each rank peaks at 1006 MiB with the
// state made here, 1019 MiB without).
void allocate_state(torch::optim::Optimizer& optimizer, OptimizerName name) {
  at::NoGradGuard no_grad;
  for (const auto& group : optimizer.param_groups()) {
    if (name == OptimizerName::kSgd &&
        static_cast<const torch::optim::SGDOptions&>(group.options()).momentum() == 0) {
      continue;  // plain SGD keeps no state
    }
    for (const at::Tensor& p : group.params()) {
      if (optimizer.state().count(state_key(p)) > 0) continue;
      // Zeros. SGD's first step then makes buf * momentum + gradient, the gradient exactly: the
      // buffer LibTorch would have cloned from it.
      ParamState zeros;
      if (name == OptimizerName::kSgd) {
        zeros.tensors["momentum_buffer"] = at::zeros_like(p, at::MemoryFormat::Preserve);
      } else {
        zeros.step = 0;
        zeros.tensors["exp_avg"] = at::zeros_like(p, at::MemoryFormat::Preserve);
        zeros.tensors["exp_avg_sq"] = at::zeros_like(p, at::MemoryFormat::Preserve);
      }
      set_state(optimizer, name, p, zeros, "the optimizer's own zeros");
    }
  }
}

std::int64_t state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) bytes += static_cast<std::int64_t>(t.nbytes());
  };
  for (const auto& [key, state] : optimizer.state()) {
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      add(sgd->momentum_buffer());
    } else if (const auto* adamw =
                   dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      add(adamw->exp_avg());
      add(adamw->exp_avg_sq());
      add(adamw->max_exp_avg_sq());
    }
  }
  return bytes;
}

}  // namespace partrain
