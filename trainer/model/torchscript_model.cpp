// Note [TorchScript model]
// ------------------------
// A TorchScript module keeps its parameters and buffers in the slots of its objects, where
// its compiled forward reads them. The loop, the Reducer, the optimizer and the checkpoints
// want a torch::nn::Module. So the module is mirrored:
//
//   jit module (runs forward)          nn::Module mirror (what the rest of partrain sees)
//   net     conv1 ---- weight   <-->   net   conv1 ---- weight      the same TensorImpl in
//           bn1   ---- weight   <-->         bn1   ---- weight      both: one tensor, two
//                 ---- running_mean <-->           ---- running_mean  registries
//
// one holder module per jit submodule, under the same name, holding the very tensors of the
// jit module's own slots, so named_parameters() gives Python's state_dict names
// ("conv1.weight", "features.0.bias", "bn1.num_batches_tracked"). What changes a tensor in
// place is seen by both: the optimizer's step, the Reducer, a checkpoint's copy_, the BN
// statistics the forward updates, and to(device), which nn::Module does with set_data on each
// tensor. train(bool) on the mirror's root also switches the jit module, whose forward reads
// its own `training` attributes.
//
// A forward that rebinds a parameter or buffer (self.x = ... instead of an in-place update)
// would leave the mirror holding a stale tensor; the probe batch catches that before training.
#include "trainer/model/torchscript_model.h"

#include <torch/csrc/jit/serialization/import.h>
#include <torch/nn/module.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>

#include "common/errors.h"

namespace partrain {
namespace {

namespace jit = torch::jit;

// The last line of a LibTorch error that says something: TorchScript's errors carry the
// script's traceback first and the RuntimeError last.
std::string last_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::istringstream text(c10_error ? c10_error->what_without_backtrace() : e.what());
  std::string last;
  for (std::string line; std::getline(text, line);) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  const auto first = last.find_first_not_of(" \t");
  return first == std::string::npos ? std::string("(no message)") : last.substr(first);
}

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// One level of the mirror: the tensors of one jit module's own slots, and a holder per child.
class ScriptHolder : public torch::nn::Module {
 public:
  explicit ScriptHolder(const jit::Module& module)
      : torch::nn::Module(module.type()->name() ? module.type()->name()->name() : "ScriptModule") {
    for (const auto& p : module.named_parameters(/*recurse=*/false)) {
      register_parameter(p.name, p.value, p.value.requires_grad());
    }
    for (const auto& b : module.named_buffers(/*recurse=*/false)) register_buffer(b.name, b.value);
    for (const auto& child : module.named_children()) {
      register_module(child.name, std::make_shared<ScriptHolder>(child.value));
    }
  }
};

// The root also switches the jit module's training flags.
class ScriptRoot final : public ScriptHolder {
 public:
  explicit ScriptRoot(jit::Module module) : ScriptHolder(module), script_(std::move(module)) {}

  void train(bool on) override {
    script_.train(on);
    torch::nn::Module::train(on);
  }

  jit::Module& script() { return script_; }

 private:
  jit::Module script_;
};

// A deep copy that shares no tensor and no autograd history with `module`: deepcopy clones
// each tensor, which in grad mode would link the copy's parameters back to the originals
// (a backward through the copy would reach them), so it runs without grad and the copy's
// parameters are then made leaves that require grad as the originals do.
jit::Module independent_copy(const jit::Module& module) {
  jit::Module copy;
  {
    at::NoGradGuard no_grad;
    copy = module.deepcopy();
  }
  const auto originals = module.parameters();
  const auto copies = copy.parameters();
  auto it = originals.begin();
  for (at::Tensor p : copies) {
    PARTRAIN_CHECK(p.unsafeGetTensorImpl() != (*it).unsafeGetTensorImpl(), Error,
                   "a deep copy of a TorchScript module shares a parameter with it");
    if ((*it).requires_grad() && !p.requires_grad()) p.requires_grad_(true);
    ++it;
  }
  return copy;
}

// Walks `original` and its `copy` (made by deepcopy, so of the same types) together and gives
// each of the copy's parameters a fresh tensor on `device`: a leaf of its own that
// data_parallel_forward can wire back to the original. `fresh` maps each original parameter
// to its copy's.
void place_parameters(const jit::Module& original, jit::Module& copy, const c10::Device& device,
                      std::map<const c10::TensorImpl*, at::Tensor>& fresh) {
  const auto& type = original.type();
  for (std::size_t i = 0; i < type->numAttributes(); ++i) {
    const c10::IValue slot = original._ivalue()->getSlot(i);
    if (type->is_parameter(i) && slot.isTensor()) {
      const at::Tensor& p = slot.toTensor();
      at::Tensor placed;
      {
        at::NoGradGuard no_grad;  // a copy with no history, even on the same device
        placed = p.to(p.options().device(device), /*non_blocking=*/false, /*copy=*/true);
      }
      copy._ivalue()->setSlot(i, placed);
      fresh[p.unsafeGetTensorImpl()] = placed;
    } else if (slot.isObject() && slot.toObject()->type()->is_module()) {
      jit::Module child(copy._ivalue()->getSlot(i).toObject());
      place_parameters(jit::Module(slot.toObject()), child, device, fresh);
    }
  }
}

class TorchScriptModel final : public TrainModel {
 public:
  explicit TorchScriptModel(jit::Module module)
      : root_(std::make_shared<ScriptRoot>(std::move(module))) {}

  torch::nn::Module& module() override { return *root_; }

  at::Tensor forward(const at::Tensor& images) override {
    return root_->script().forward({images}).toTensor();
  }

  DataParallelReplica replicate(const c10::Device& device) override {
    jit::Module& script = root_->script();
    jit::Module copy = independent_copy(script);
    copy.to(device);  // the buffers; the parameters are placed afresh below
    std::map<const c10::TensorImpl*, at::Tensor> fresh;
    place_parameters(script, copy, device, fresh);
    DataParallelReplica replica;
    for (const auto& p : root_->parameters())
      replica.parameters.push_back(fresh.at(p.unsafeGetTensorImpl()));
    replica.forward = [copy](const at::Tensor& x) mutable { return copy.forward({x}).toTensor(); };
    return replica;
  }

 private:
  std::shared_ptr<ScriptRoot> root_;
};

// Every parameter and buffer tensor of `module`, by name, for the identity checks.
std::map<std::string, const c10::TensorImpl*> state_impls(const jit::Module& module) {
  std::map<std::string, const c10::TensorImpl*> impls;
  for (const auto& p : module.named_parameters()) impls[p.name] = p.value.unsafeGetTensorImpl();
  for (const auto& b : module.named_buffers()) impls[b.name] = b.value.unsafeGetTensorImpl();
  return impls;
}

void check_parameters(const jit::Module& module, const std::string& path) {
  std::map<const c10::TensorImpl*, std::string> seen;
  std::size_t trainable = 0;
  for (const auto& p : module.named_parameters()) {
    auto [it, inserted] = seen.emplace(p.value.unsafeGetTensorImpl(), p.name);
    PARTRAIN_CHECK(inserted, UsageError, path, ": parameters ", it->second, " and ", p.name,
                   " are one tensor (tied weights), which partrain cannot train yet");
    if (p.value.requires_grad()) ++trainable;
  }
  PARTRAIN_CHECK(!seen.empty(), UsageError, path,
                 ": the TorchScript module has no parameters, so there is nothing to train");
  PARTRAIN_CHECK(trainable > 0, UsageError, path,
                 ": every parameter of the TorchScript module has requires_grad=False, so there "
                 "is nothing to train");
}

// Forward and backward of a small batch, in training mode, on a deep copy: what the loop will
// ask of the module, checked here so that a wrong model is a clear exit 2, not an error in
// the middle of the first step on every rank.
void probe(const jit::Module& module, const std::string& path, const ModelShape& shape) {
  constexpr int64_t kProbe = 3;  // neither 1 (BatchNorm refuses it) nor a likely channel count
  const int64_t width = shape.image_width > 0 ? shape.image_width : shape.image_size;
  const std::vector<int64_t> input_shape{kProbe, shape.in_channels, shape.image_size, width};
  const std::string batch = shape_text(input_shape);
  jit::Module copy = independent_copy(module);
  copy.train(true);
  const auto before = state_impls(copy);
  auto gen = at::detail::createCPUGenerator(0);
  at::Tensor x = at::randn(input_shape, gen);
  c10::IValue out;
  try {
    out = copy.forward({x});
  } catch (const std::exception& e) {
    throw UsageError(path + ": the model's forward fails on a batch " + batch + ": " +
                     last_line(e));
  }
  PARTRAIN_CHECK(out.isTensor(), UsageError, path, ": the model's forward returns ", out.tagKind(),
                 " for a batch ", batch, "; it must return a tensor of logits [", kProbe, ", ",
                 shape.num_classes, "]");
  const at::Tensor logits = out.toTensor();
  PARTRAIN_CHECK(
      logits.dim() == 2 && logits.size(0) == kProbe && logits.size(1) == shape.num_classes,
      UsageError, path, ": the model's forward maps a batch ", batch, " to ",
      shape_text(logits.sizes()), "; expected logits [", kProbe, ", ", shape.num_classes, "] (",
      shape.num_classes, " classes in the data set)");
  PARTRAIN_CHECK(logits.is_floating_point(), UsageError, path, ": the model's forward returns ",
                 c10::toString(logits.scalar_type()), " values, not floating-point logits");
  PARTRAIN_CHECK(logits.requires_grad(), UsageError, path,
                 ": the model's output does not depend on any of its parameters");
  try {
    logits.sum().backward();
  } catch (const std::exception& e) {
    throw UsageError(path + ": the model's backward fails: " + last_line(e));
  }
  for (const auto& [name, impl] : state_impls(copy)) {
    const auto it = before.find(name);
    PARTRAIN_CHECK(it != before.end() && it->second == impl, UsageError, path,
                   ": the model's forward replaces ", name,
                   " with a new tensor; update it in place (e.g. x.copy_(...)) so that "
                   "training sees one tensor");
  }
}

}  // namespace

std::unique_ptr<TrainModel> load_torchscript_model(const std::string& path,
                                                   const ModelShape& shape) {
  std::error_code error;
  PARTRAIN_CHECK(std::filesystem::is_regular_file(path, error), UsageError, path,
                 ": no such file (model.torchscript names a file saved with torch.jit.save)");
  jit::Module module;
  try {
    module = jit::load(path, torch::Device(torch::kCPU));
  } catch (const std::exception& e) {
    throw UsageError(path +
                     ": not a TorchScript file (expected torch.jit.save of a scripted or traced "
                     "module): " +
                     last_line(e));
  }
  check_parameters(module, path);
  probe(module, path, shape);
  module.train(true);
  return std::make_unique<TorchScriptModel>(std::move(module));
}

}  // namespace partrain
