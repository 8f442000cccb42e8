// Checkpoint layout, in OUTPUT/checkpoints/:
//
//   epoch-0003.pt      one whole checkpoint: a pickled dict, the format of Python's
//                      torch.save, so `torch.load("epoch-0003.pt")["model"]` gives the
//                      state dict (names like "conv1.weight", no wrapper prefix)
//   latest.json        the manifest: names the newest checkpoint that was written whole
//   best.pt            a copy of the checkpoint of the epoch with the highest test accuracy
//                      so far (the first such epoch on a tie)
//
// A checkpoint's dict: "format", "model" (the state dict), "optimizer" ({"name": "sgd" |
// "adamw", "state": {parameter name: {"momentum_buffer"} or {"step", "exp_avg",
// "exp_avg_sq"}}}) and "meta" (JSON text: epoch, step, world size, model, loss scale, the
// epoch records). Checkpoints of earlier versions hold SGD's buffers under "momentum".
//
// Writing order: checkpoint to a temp name -> fsync -> rename; then the manifest the same
// way. A crash before the manifest's rename leaves the previous manifest, which still names
// a complete file; an orphaned temp file is ignored (and removed by the next save). So at
// any moment the manifest names a complete checkpoint, or there is no manifest.
#include "trainer/loop/checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/types.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm_backends/communicator.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
constexpr const char* kFormat = "partrain.checkpoint/1";
constexpr std::uint64_t kMaxCheckpointBytes = 16ull << 30;

std::string checkpoint_name(int epoch) {
  char name[32];
  std::snprintf(name, sizeof(name), "epoch-%04d.pt", epoch);
  return name;
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  PARTRAIN_CHECK(!ec, UsageError, "checkpoint ", path, ": cannot read (", ec.message(), ")");
  PARTRAIN_CHECK(size <= kMaxCheckpointBytes, UsageError, "checkpoint ", path, ": ", size,
                 " bytes is larger than any checkpoint partrain writes");
  std::ifstream in(path, std::ios::binary);
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  PARTRAIN_CHECK(in.gcount() == static_cast<std::streamsize>(size), UsageError, "checkpoint ", path,
                 ": short read");
  return bytes;
}

Json epochs_to_json(const std::vector<EpochRecord>& epochs) {
  Json list = Json::array();
  for (const auto& e : epochs) list.push_back(Json(epoch_to_json(e)));
  return list;
}

std::vector<EpochRecord> epochs_from_json(const Json& list) {
  std::vector<EpochRecord> epochs;
  for (const auto& j : list) epochs.push_back(epoch_from_json(j));
  return epochs;
}

std::string shape_text(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return "adamw";
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return "sgd";
  throw Error("checkpoint: an optimizer partrain does not make");
}

// The optimizer's state is keyed by parameter identity in LibTorch; in the file, by the
// parameter's name, so that it survives a restart and reads naturally in Python.
std::string state_key(const at::Tensor& parameter) {
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
}

c10::impl::GenericDict optimizer_to_dict(const torch::optim::Optimizer& optimizer,
                                         const torch::nn::Module& model) {
  const std::string name = optimizer_name(optimizer);
  c10::impl::GenericDict per_parameter(c10::StringType::get(), c10::AnyType::get());
  const auto& state = optimizer.state();
  for (const auto& item : model.named_parameters()) {
    auto it = state.find(state_key(item.value()));
    if (it == state.end()) continue;
    c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
    if (name == "sgd") {
      const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (!sgd.momentum_buffer().defined()) continue;
      entry.insert("momentum_buffer", sgd.momentum_buffer().detach().cpu());
    } else {
      const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      entry.insert("step", adamw.step());
      entry.insert("exp_avg", adamw.exp_avg().detach().cpu());
      entry.insert("exp_avg_sq", adamw.exp_avg_sq().detach().cpu());
      if (adamw.max_exp_avg_sq().defined())
        entry.insert("max_exp_avg_sq", adamw.max_exp_avg_sq().detach().cpu());
    }
    per_parameter.insert(item.key(), entry);
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("name", name);
  dict.insert("state", per_parameter);
  return dict;
}

at::Tensor saved_tensor(const c10::impl::GenericDict& entry, const std::string& key,
                        const at::Tensor& parameter, const std::string& path,
                        const std::string& name) {
  PARTRAIN_CHECK(entry.contains(key) && entry.at(key).isTensor(), UsageError, "checkpoint ", path,
                 ": the optimizer state of '", name, "' has no ", key);
  at::Tensor t = entry.at(key).toTensor();
  PARTRAIN_CHECK(t.sizes() == parameter.sizes(), UsageError, "checkpoint ", path,
                 ": the optimizer state of '", name, "' does not fit its parameter");
  return t.to(parameter.device());
}

void optimizer_from_dict(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                         const c10::impl::GenericDict& dict, const std::string& path) {
  const std::string name = optimizer_name(optimizer);
  PARTRAIN_CHECK(dict.contains("name") && dict.contains("state"), UsageError, "checkpoint ", path,
                 ": its optimizer state is not readable");
  const std::string saved = dict.at("name").toStringRef();
  PARTRAIN_CHECK(saved == name, UsageError, "checkpoint ", path, " was written with optimizer ",
                 saved, " and this run uses ", name,
                 "; use checkpoint.resume: never to start afresh");
  const auto per_parameter = dict.at("state").toGenericDict();
  auto& state = optimizer.state();
  for (auto& item : model.named_parameters()) {
    if (!per_parameter.contains(item.key())) continue;
    const auto entry = per_parameter.at(item.key()).toGenericDict();
    const at::Tensor& p = item.value();
    if (name == "sgd") {
      auto sgd = std::make_unique<torch::optim::SGDParamState>();
      sgd->momentum_buffer(saved_tensor(entry, "momentum_buffer", p, path, item.key()));
      state[state_key(p)] = std::move(sgd);
    } else {
      PARTRAIN_CHECK(entry.contains("step") && entry.at("step").isInt(), UsageError, "checkpoint ",
                     path, ": the optimizer state of '", item.key(), "' has no step");
      auto adamw = std::make_unique<torch::optim::AdamWParamState>();
      adamw->step(entry.at("step").toInt());
      adamw->exp_avg(saved_tensor(entry, "exp_avg", p, path, item.key()));
      adamw->exp_avg_sq(saved_tensor(entry, "exp_avg_sq", p, path, item.key()));
      if (entry.contains("max_exp_avg_sq"))
        adamw->max_exp_avg_sq(saved_tensor(entry, "max_exp_avg_sq", p, path, item.key()));
      state[state_key(p)] = std::move(adamw);
    }
  }
}

}  // namespace

// Broadcasts rank 0's `length` and, when it is >= 0, the bytes (into *bytes on the others).
// They travel as int64 tensors on the model's device: nccl reads only device memory.
std::int64_t Checkpointer::broadcast_bytes(comm::Communicator& comm, const torch::nn::Module& model,
                                           std::int64_t length, std::string* bytes) {
  const auto parameters = model.parameters();
  const auto options =
      torch::TensorOptions()
          .dtype(torch::kInt64)
          .device(parameters.empty() ? torch::Device(torch::kCPU) : parameters.front().device());
  auto header = torch::full({1}, length, options);
  broadcast_tensor(comm, header, 0);
  length = header.cpu().item<std::int64_t>();
  if (length < 0 || bytes == nullptr) return length;
  PARTRAIN_CHECK(static_cast<std::uint64_t>(length) <= kMaxCheckpointBytes, CommError,
                 "rank 0 announced a checkpoint of ", length, " bytes");
  const std::int64_t words = (length + 7) / 8;
  auto payload = torch::zeros({words}, torch::TensorOptions().dtype(torch::kInt64));
  if (comm.rank() == 0) std::memcpy(payload.data_ptr(), bytes->data(), bytes->size());
  payload = payload.to(options.device());
  broadcast_tensor(comm, payload, 0);
  payload = payload.cpu();
  if (comm.rank() != 0) bytes->assign(static_cast<const char*>(payload.data_ptr()), length);
  return length;
}

Checkpointer::Checkpointer(const Config& config, const WorkerEnv& env)
    : config_(config), env_(env), dir_(config.output_dir + "/checkpoints") {}

void Checkpointer::maybe_save(const TrainingPosition& at, const torch::nn::Module& model,
                              const torch::optim::Optimizer& optimizer,
                              const std::vector<EpochRecord>& epochs, comm::Communicator* comm) {
  const int epoch = at.epoch;
  const int every = config_.checkpoint.every_epochs;
  const bool due = every > 0 && (epoch % every == 0 || epoch == config_.train.epochs);
  // Decided on rank 0 alone: the others need not agree, since best.pt has no barrier.
  bool best = false;
  if (env_.rank == 0 && !epochs.empty()) {
    best = true;
    for (std::size_t i = 0; i + 1 < epochs.size(); ++i)
      best = best && epochs.back().test_accuracy > epochs[i].test_accuracy;
  }
  if (env_.rank == 0 && (due || best)) {
    fs::create_directories(dir_);
    c10::Dict<std::string, at::Tensor> model_state;
    for (const auto& item : model.named_parameters())
      model_state.insert(item.key(), item.value().detach().cpu());
    for (const auto& item : model.named_buffers())
      model_state.insert(item.key(), item.value().detach().cpu());

    Json meta = {{"format", kFormat},
                 {"epoch", epoch},
                 {"step", at.step},
                 {"world_size", env_.world_size},
                 {"model", name_of(config_.model.name)},
                 {"width", config_.model.width},
                 {"norm", name_of(config_.model.norm)},
                 {"seed", config_.seed},
                 {"optimizer", optimizer_name(optimizer)},
                 {"test_accuracy", epochs.empty() ? 0.0 : epochs.back().test_accuracy},
                 {"epochs", epochs_to_json(epochs)}};
    if (at.loss_scaler) {
      meta["loss_scale"] = at.loss_scaler->scale;
      meta["loss_scale_good_steps"] = at.loss_scaler->good_steps;
    }
    c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
    top.insert("format", std::string(kFormat));
    top.insert("model", model_state);
    top.insert("optimizer", optimizer_to_dict(optimizer, model));
    top.insert("meta", meta.dump());
    std::vector<char> pickled = torch::pickle_save(c10::IValue(top));
    const std::string bytes(pickled.begin(), pickled.end());

    if (due) {
      std::string name = checkpoint_name(epoch);
      write_file_atomically(dir_ + "/" + name, bytes);
      Json manifest = {{"format", kFormat},
                       {"file", name},
                       {"epoch", epoch},
                       {"step", at.step},
                       {"bytes", bytes.size()}};
      write_file_atomically(dir_ + "/latest.json", manifest.dump(2) + "\n");

      // Keep the newest `keep` checkpoints; leftover temp files from a crash go too.
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(dir_)) {
        const auto file = entry.path().filename().string();
        if (file.rfind("epoch-", 0) == 0 && entry.path().extension() == ".pt")
          files.push_back(entry.path());
        if (file.find(".tmp") != std::string::npos) fs::remove(entry.path());
      }
      std::sort(files.begin(), files.end());
      for (std::size_t i = 0; i + config_.checkpoint.keep < files.size(); ++i) fs::remove(files[i]);
    }
    if (best) write_file_atomically(dir_ + "/best.pt", bytes);
  }
  if (due && comm) comm->barrier();
}

// Where the run resumes is rank 0's decision alone: the hosts of a run need not share a
// filesystem, and ranks that read OUTPUT/checkpoints each on their own could start at
// different epochs, after which their collectives no longer match. So rank 0 picks the
// checkpoint and broadcasts its bytes (or "start fresh", or "failed"); every rank then loads
// the same bytes through the same checks.
std::string Checkpointer::choose_checkpoint() const {
  const ResumeFrom& resume = config_.checkpoint.resume;
  if (resume.mode == ResumeMode::kNever) return "";
  if (resume.mode == ResumeMode::kPath) return resume.path;
  std::string manifest_path = dir_ + "/latest.json";
  if (!fs::exists(manifest_path)) return "";
  std::string path;
  try {
    Json manifest = Json::parse(read_file(manifest_path));
    path = dir_ + "/" + manifest.at("file").get<std::string>();
  } catch (const Json::exception& e) {
    throw UsageError("checkpoint manifest " + manifest_path + " is not valid: " + e.what());
  }
  PARTRAIN_CHECK(fs::exists(path), UsageError, "checkpoint manifest ", manifest_path, " names ",
                 path, ", which does not exist");
  return path;
}

TrainingPosition Checkpointer::resume(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                      comm::Communicator* comm) {
  constexpr std::int64_t kFresh = -1;
  constexpr std::int64_t kRank0Failed = -2;
  TrainingPosition position;
  const bool shared = comm != nullptr && comm->size() > 1;
  std::string path;
  std::string bytes;
  std::int64_t length = kFresh;
  if (env_.rank == 0) {
    try {
      path = choose_checkpoint();
      if (!path.empty()) bytes = read_file(path);
      length = path.empty() ? kFresh : static_cast<std::int64_t>(bytes.size());
    } catch (const UsageError&) {
      // The others would wait for the checkpoint until the timeout: tell them now.
      if (shared) broadcast_bytes(*comm, model, kRank0Failed, nullptr);
      throw;
    }
  }
  if (shared) {
    length = broadcast_bytes(*comm, model, length, &bytes);
    PARTRAIN_CHECK(length != kRank0Failed, UsageError,
                   "rank 0 could not load the checkpoint to resume from (its message says why)");
    if (env_.rank != 0 && length >= 0) {
      path = "rank 0's checkpoint (" + std::to_string(length) + " bytes)";
    }
  }
  if (length == kFresh) return position;

  c10::IValue loaded;
  try {
    loaded = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error& e) {
    throw UsageError("checkpoint " + path +
                     " cannot be read (truncated or not a partrain checkpoint)");
  }
  PARTRAIN_CHECK(loaded.isGenericDict(), UsageError, "checkpoint ", path,
                 " is not a partrain checkpoint");
  auto top = loaded.toGenericDict();
  PARTRAIN_CHECK(top.contains("format") && top.at("format").isString() &&
                     top.at("format").toStringRef() == kFormat && top.contains("model") &&
                     top.contains("meta") &&
                     (top.contains("optimizer") || top.contains("momentum")),
                 UsageError, "checkpoint ", path, " is not a ", kFormat, " checkpoint");
  Json meta = Json::parse(top.at("meta").toStringRef());
  const int saved_world = meta.at("world_size").get<int>();
  PARTRAIN_CHECK(saved_world == env_.world_size, UsageError, "checkpoint ", path,
                 " was written by a run of ", saved_world, " ranks; this run has ", env_.world_size,
                 " (the global batch would change); use checkpoint.resume: never to start afresh");

  auto model_state = top.at("model").toGenericDict();
  torch::NoGradGuard no_grad;
  std::size_t expected = 0;
  auto load_into = [&](const std::string& name, at::Tensor& target) {
    PARTRAIN_CHECK(model_state.contains(name), UsageError, "checkpoint ", path,
                   " was written for another model (", meta.at("model").get<std::string>(),
                   "): it has no '", name, "'");
    at::Tensor saved = model_state.at(name).toTensor();
    PARTRAIN_CHECK(saved.sizes() == target.sizes(), UsageError, "checkpoint ", path,
                   " was written for another model: '", name, "' is ", shape_text(saved),
                   " there and ", shape_text(target), " here");
    target.copy_(saved);
    ++expected;
  };
  for (auto& item : model.named_parameters()) load_into(item.key(), item.value());
  for (auto& item : model.named_buffers()) load_into(item.key(), item.value());
  PARTRAIN_CHECK(expected == model_state.size(), UsageError, "checkpoint ", path,
                 " was written for another model: it holds ", model_state.size(),
                 " tensors, this model ", expected);

  if (top.contains("optimizer")) {
    optimizer_from_dict(optimizer, model, top.at("optimizer").toGenericDict(), path);
  } else {  // an earlier version's checkpoint: SGD momentum buffers by parameter name
    c10::impl::GenericDict sgd(c10::StringType::get(), c10::AnyType::get());
    c10::impl::GenericDict per_parameter(c10::StringType::get(), c10::AnyType::get());
    for (const auto& item : top.at("momentum").toGenericDict()) {
      c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
      entry.insert("momentum_buffer", item.value());
      per_parameter.insert(item.key(), entry);
    }
    sgd.insert("name", std::string("sgd"));
    sgd.insert("state", per_parameter);
    optimizer_from_dict(optimizer, model, sgd, path);
  }
  if (meta.contains("loss_scale")) {
    LossScalerState scaler;
    scaler.scale = meta.at("loss_scale").get<double>();
    scaler.good_steps = meta.at("loss_scale_good_steps").get<std::int64_t>();
    position.loss_scaler = scaler;
  }
  position.epoch = meta.at("epoch").get<int>();
  position.step = meta.at("step").get<std::int64_t>();
  position.source = path;
  previous_epochs_ = epochs_from_json(meta.at("epochs"));
  return position;
}

}  // namespace partrain
