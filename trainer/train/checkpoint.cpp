// Checkpoint layout, in OUTPUT/checkpoints/:
//
//   epoch-0003.pt      one whole checkpoint: a pickled dict, the format of Python's
//                      torch.save, so `torch.load("epoch-0003.pt")["model"]` gives the
//                      state dict (names like "conv1.weight", no wrapper prefix)
//   latest.json        the manifest: names the newest checkpoint that was written whole
//
// Writing order: checkpoint to a temp name -> fsync -> rename; then the manifest the same
// way. A crash before the manifest's rename leaves the previous manifest, which still names
// a complete file; an orphaned temp file is ignored (and removed by the next save). So at
// any moment the manifest names a complete checkpoint, or there is no manifest.
#include "trainer/train/checkpoint.h"

#include <torch/nn/module.h>
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
#include "trainer/train/tensor_buffer.h"

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

void Checkpointer::maybe_save(int epoch, std::int64_t step, const torch::nn::Module& model,
                              const torch::optim::Optimizer& optimizer,
                              const std::vector<EpochRecord>& epochs, comm::Communicator* comm) {
  const int every = config_.checkpoint.every_epochs;
  if (every <= 0 || (epoch % every != 0 && epoch != config_.train.epochs)) return;
  if (env_.rank == 0) {
    fs::create_directories(dir_);
    c10::Dict<std::string, at::Tensor> model_state;
    for (const auto& item : model.named_parameters())
      model_state.insert(item.key(), item.value().detach().cpu());
    for (const auto& item : model.named_buffers())
      model_state.insert(item.key(), item.value().detach().cpu());

    // SGD keeps one momentum buffer per parameter; they are saved under the parameter's name.
    c10::Dict<std::string, at::Tensor> momentum;
    const auto& state = optimizer.state();
    for (const auto& item : model.named_parameters()) {
      auto it = state.find(c10::guts::to_string(item.value().unsafeGetTensorImpl()));
      if (it == state.end()) continue;
      const auto& sgd = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (sgd.momentum_buffer().defined())
        momentum.insert(item.key(), sgd.momentum_buffer().detach().cpu());
    }

    Json meta = {{"format", kFormat},
                 {"epoch", epoch},
                 {"step", step},
                 {"world_size", env_.world_size},
                 {"model", config_.model.name},
                 {"width", config_.model.width},
                 {"norm", config_.model.norm},
                 {"seed", config_.seed},
                 {"epochs", epochs_to_json(epochs)}};
    c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
    top.insert("format", std::string(kFormat));
    top.insert("model", model_state);
    top.insert("momentum", momentum);
    top.insert("meta", meta.dump());
    std::vector<char> bytes = torch::pickle_save(c10::IValue(top));

    std::string name = checkpoint_name(epoch);
    write_file_atomically(dir_ + "/" + name, std::string(bytes.begin(), bytes.end()));
    Json manifest = {{"format", kFormat},
                     {"file", name},
                     {"epoch", epoch},
                     {"step", step},
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
  if (comm) comm->barrier();
}

// Where the run resumes is rank 0's decision alone: the hosts of a run need not share a
// filesystem, and ranks that read OUTPUT/checkpoints each on their own could start at
// different epochs, after which their collectives no longer match. So rank 0 picks the
// checkpoint and broadcasts its bytes (or "start fresh", or "failed"); every rank then loads
// the same bytes through the same checks.
std::string Checkpointer::choose_checkpoint() const {
  const std::string& mode = config_.checkpoint.resume;
  if (mode == "never") return "";
  if (mode != "auto") return mode;
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
                     top.contains("meta") && top.contains("momentum"),
                 UsageError, "checkpoint ", path, " is not a ", kFormat, " checkpoint");
  Json meta = Json::parse(top.at("meta").toStringRef());
  const int saved_world = meta.at("world_size").get<int>();
  PARTRAIN_CHECK(saved_world == env_.world_size, UsageError, "checkpoint ", path,
                 " was written by a run of ", saved_world, " ranks; this run has ", env_.world_size,
                 " (the global batch would change); use checkpoint.resume: never to start afresh");

  auto model_state = top.at("model").toGenericDict();
  auto momentum = top.at("momentum").toGenericDict();
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

  auto& state = optimizer.state();
  for (auto& item : model.named_parameters()) {
    if (!momentum.contains(item.key())) continue;
    auto buffer = momentum.at(item.key()).toTensor().to(item.value().device());
    auto sgd = std::make_unique<torch::optim::SGDParamState>();
    sgd->momentum_buffer(buffer);
    state[c10::guts::to_string(item.value().unsafeGetTensorImpl())] = std::move(sgd);
  }
  position.epoch = meta.at("epoch").get<int>();
  position.step = meta.at("step").get<std::int64_t>();
  position.source = path;
  previous_epochs_ = epochs_from_json(meta.at("epochs"));
  return position;
}

}  // namespace partrain
