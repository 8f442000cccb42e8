// Checkpoint layout, in OUTPUT/checkpoints/:
//
//   epoch-0003.pt      one whole checkpoint: a pickled dict, the format of Python's
//                      torch.save, so `torch.load("epoch-0003.pt")["model"]` gives the
//                      state dict (names like "conv1.weight", no wrapper prefix)
//   epoch-0003.step-0000001234.pt
//                      the same, taken mid-epoch at optimizer step 1234 after 3 epochs
//                      completed (checkpoint.every_steps / every_seconds, or a stop signal);
//                      its meta holds the position in the epoch (MidEpoch)
//   latest.json        the manifest: names the newest checkpoint that was written whole
//                      (CheckpointManifest, checkpoint_format.h)
//   best.pt            a copy of the checkpoint of the epoch with the highest test accuracy
//                      so far (the first such epoch on a tie)
//
// A checkpoint's dict: "format", "model" (the state dict), "optimizer" ({"name": "sgd" |
// "adamw", "state": {parameter name: {"momentum_buffer"} or {"step", "exp_avg",
// "exp_avg_sq"}}}) and "meta" (JSON text: epoch, step, world size, model, loss scale, the
// epoch records, the global batch and its shares; CheckpointMeta), and one entry per
// attached CheckpointState under its own key ("powersgd": PowerSGD's factors and error
// buffers), absent from checkpoints of runs without it. Checkpoints of earlier versions hold
// SGD's buffers under "momentum".
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
#include <sstream>
#include <string_view>
#include <thread>

#include "comm_backends/communicator.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/stop_request.h"
#include "trainer/observe/test_injection.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

// What rank 0 broadcasts in place of a checkpoint's length.
constexpr std::int64_t kFresh = -1;        // nothing to resume from: start afresh
constexpr std::int64_t kRank0Failed = -2;  // rank 0 failed to choose or read it

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

// The dict of a checkpoint's bytes, its format checked. Checkpoints of earlier versions hold
// "momentum" where later ones hold "optimizer" (upgrade_older_formats()).
c10::impl::GenericDict unpickle_checkpoint(const std::string& bytes, const std::string& path) {
  c10::IValue loaded;
  try {
    loaded = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error&) {
    throw UsageError("checkpoint " + path +
                     " cannot be read (truncated or not a partrain checkpoint)");
  }
  PARTRAIN_CHECK(loaded.isGenericDict(), UsageError, "checkpoint ", path,
                 " is not a partrain checkpoint");
  auto top = loaded.toGenericDict();
  PARTRAIN_CHECK(top.contains("format") && top.at("format").isString() &&
                     top.at("format").toStringRef() == kCheckpointFormat && top.contains("model") &&
                     top.contains("meta") &&
                     (top.contains("optimizer") || top.contains("momentum")),
                 UsageError, "checkpoint ", path, " is not a ", kCheckpointFormat, " checkpoint");
  return top;
}

// Checkpoints of earlier versions hold only SGD's momentum buffers, by parameter name, under
// "momentum": they become the "optimizer" entry that later versions write.
void upgrade_older_formats(c10::impl::GenericDict& top) {
  if (top.contains("optimizer")) return;
  c10::impl::GenericDict sgd(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericDict per_parameter(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : top.at("momentum").toGenericDict()) {
    c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
    entry.insert("momentum_buffer", item.value());
    per_parameter.insert(item.key(), entry);
  }
  sgd.insert("name", std::string("sgd"));
  sgd.insert("state", per_parameter);
  top.insert("optimizer", sgd);
}

// Every parameter and buffer of the model from the checkpoint's state dict, which must hold
// exactly those names with those shapes.
void load_model(torch::nn::Module& model, const c10::impl::GenericDict& top,
                const CheckpointMeta& meta, const std::string& path) {
  auto model_state = top.at("model").toGenericDict();
  std::size_t expected = 0;
  auto load_into = [&](const std::string& name, at::Tensor& target) {
    PARTRAIN_CHECK(model_state.contains(name), UsageError, "checkpoint ", path,
                   " was written for another model (", meta.model, "): it has no '", name, "'");
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
}

TrainingPosition position_of(const CheckpointMeta& meta, const std::string& path) {
  TrainingPosition position;
  position.epoch = meta.epoch;
  position.step = meta.step;
  position.loss_scaler = meta.loss_scaler;
  position.mid_epoch = meta.mid_epoch;
  position.source = path;
  position.written_by = meta.world_size;
  return position;
}

// The state dict as torch.save writes it: parameters and buffers by name, on the CPU.
c10::Dict<std::string, at::Tensor> model_state_of(const torch::nn::Module& model) {
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& item : model.named_parameters())
    state.insert(item.key(), item.value().detach().cpu());
  for (const auto& item : model.named_buffers())
    state.insert(item.key(), item.value().detach().cpu());
  return state;
}

}  // namespace

// What every rank resumes from: the checkpoint's bytes and its name for messages, or nothing.
struct Checkpointer::Fetched {
  bool fresh = true;  // nothing to resume from
  std::string path;
  std::string bytes;
};

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
  // Every rank decides the same: the test accuracies are sums over the ranks (evaluate()),
  // the same bits on every rank. That matters where a state is attached, whose save() may be
  // a collective that every rank enters only when something is written.
  bool best = !epochs.empty();
  for (std::size_t i = 0; i + 1 < epochs.size(); ++i)
    best = best && epochs.back().test_accuracy > epochs[i].test_accuracy;
  std::vector<std::pair<std::string, c10::IValue>> states;
  if (due || best) {
    for (CheckpointState* state : states_) states.emplace_back(state->key(), state->save());
  }
  if (env_.rank == 0 && (due || best)) {
    fs::create_directories(dir_);
    const std::string bytes = checkpoint_bytes(at, model, optimizer, epochs, states);
    if (due) write_checkpoint(checkpoint_file_name(epoch), at, bytes);
    if (best) write_file_atomically(dir_ + "/best.pt", bytes);
  }
  if (due) last_save_ = std::chrono::steady_clock::now();
  if (due && comm) comm->barrier();
}

std::string Checkpointer::save_step(const TrainingPosition& at, const torch::nn::Module& model,
                                    const torch::optim::Optimizer& optimizer,
                                    const std::vector<EpochRecord>& epochs,
                                    comm::Communicator* comm) {
  const std::string name = checkpoint_file_name(at.epoch, at.step);
  // Every rank: a state's save() may be a collective.
  std::vector<std::pair<std::string, c10::IValue>> states;
  for (CheckpointState* state : states_) states.emplace_back(state->key(), state->save());
  if (env_.rank == 0) {
    fs::create_directories(dir_);
    write_checkpoint(name, at, checkpoint_bytes(at, model, optimizer, epochs, states));
  }
  last_save_ = std::chrono::steady_clock::now();
  if (comm) comm->barrier();
  return name;
}

bool Checkpointer::step_checkpoint_due(std::int64_t step) const {
  const std::int64_t every = config_.checkpoint.every_steps;
  return every > 0 && step % every == 0;
}

bool Checkpointer::timed_checkpoint_due() const {
  const double every = config_.checkpoint.every_seconds;
  return every > 0 &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_).count() >=
             every;
}

// Rank 0: the file, then the manifest that names it, then the oldest beyond keep go. Each step
// leaves the directory resumable if the process dies right after it (checkpoint.cpp's top).
void Checkpointer::write_checkpoint(const std::string& name, const TrainingPosition& at,
                                    const std::string& bytes) {
  const InjectedFaults faults = injected_faults(env_.rank);
  const int save = ++saves_;
  // Tests only (PARTRAIN_TEST_SAVE_FAULT): this save dies at the step named, as in a power cut.
  auto die_if = [&](SaveFault::Phase phase) {
    if (faults.save_fault.strikes(phase, save)) die_at_once();
  };
  die_if(SaveFault::Phase::kBefore);
  const std::string path = dir_ + "/" + name;
  const bool half = faults.save_fault.strikes(SaveFault::Phase::kWrite, save);
  const std::string temp =
      write_temp_file(path, half ? std::string_view(bytes).substr(0, bytes.size() / 2) : bytes);
  die_if(SaveFault::Phase::kWrite);
  // Tests only (PARTRAIN_TEST_STOP_SAVE_DELAY): the stop's save held open, half done.
  if (StopRequest::requested() && faults.stop_save_delay_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(faults.stop_save_delay_s));
  }
  die_if(SaveFault::Phase::kRename);
  commit_file(temp, path);
  die_if(SaveFault::Phase::kManifest);
  write_manifest(dir_, {name, at.epoch, at.step, bytes.size()});
  die_if(SaveFault::Phase::kPrune);
  prune_checkpoints();
}

// A whole checkpoint, pickled as torch.save pickles a dict.
std::string Checkpointer::checkpoint_bytes(
    const TrainingPosition& at, const torch::nn::Module& model,
    const torch::optim::Optimizer& optimizer, const std::vector<EpochRecord>& epochs,
    const std::vector<std::pair<std::string, c10::IValue>>& states) const {
  CheckpointMeta meta;
  meta.epoch = at.epoch;
  meta.step = at.step;
  meta.world_size = env_.world_size;
  meta.model = name_of(config_.model.name);
  meta.width = config_.model.width;
  meta.norm = name_of(config_.model.norm);
  meta.seed = config_.seed;
  meta.optimizer = optimizer_name(optimizer);
  meta.test_accuracy = epochs.empty() ? 0.0 : epochs.back().test_accuracy;
  meta.epochs = epochs;
  meta.loss_scaler = at.loss_scaler;
  meta.mid_epoch = at.mid_epoch;
  if (config_.data.global_batch_size > 0) {
    meta.global_batch_size = config_.data.global_batch_size;
    meta.accumulate_steps = config_.train.accumulate_steps;
    meta.shares_rule = name_of(config_.data.balance);
    meta.shares = at.shares.empty() ? config_.data.shares : at.shares;
  }
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("format", std::string(kCheckpointFormat));
  top.insert("model", model_state_of(model));
  top.insert("optimizer", optimizer_to_dict(optimizer, model));
  top.insert("meta", meta_to_text(meta));
  for (const auto& [key, value] : states) top.insert(key, value);
  std::vector<char> pickled = torch::pickle_save(c10::IValue(top));
  return std::string(pickled.begin(), pickled.end());
}

// Keeps the newest checkpoint.keep checkpoints; leftover temp files from a crash go too.
void Checkpointer::prune_checkpoints() const {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const auto file = entry.path().filename().string();
    if (is_checkpoint_file_name(file)) files.push_back(entry.path());
    if (file.find(".tmp") != std::string::npos) fs::remove(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (std::size_t i = 0; i + config_.checkpoint.keep < files.size(); ++i) fs::remove(files[i]);
}

// Where the run resumes is rank 0's decision alone: the hosts of a run need not share a
// filesystem, and ranks that read OUTPUT/checkpoints each on their own could start at
// different epochs, after which their collectives no longer match. So rank 0 picks the
// checkpoint and broadcasts its bytes (or "start fresh", or "failed"); every rank then loads
// the same bytes through the same checks.
TrainingPosition Checkpointer::resume(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                      comm::Communicator* comm) {
  const Fetched fetched = fetch_checkpoint(model, comm);
  if (fetched.fresh) return TrainingPosition{};
  const std::string& path = fetched.path;
  auto top = unpickle_checkpoint(fetched.bytes, path);
  upgrade_older_formats(top);
  const CheckpointMeta meta = meta_from_text(top.at("meta").toStringRef());
  check_fits_this_run(meta, path);
  torch::NoGradGuard no_grad;  // loading writes into parameters, outside any graph
  load_model(model, top, meta, path);
  optimizer_from_dict(optimizer, model, top.at("optimizer").toGenericDict(), path);
  previous_epochs_ = meta.epochs;
  for (const auto& item : top) {
    const std::string& key = item.key().toStringRef();
    if (key != "format" && key != "model" && key != "optimizer" && key != "meta" &&
        key != "momentum") {
      resumed_states_[key] = item.value();
    }
  }
  resumed_path_ = path;
  TrainingPosition position = position_of(meta, path);
  position.shares = resumed_shares(meta);
  return position;
}

// auto's split goes on where the checkpoint left it when it still fits: the same ranks (a
// rank's speed belongs to its device) and the same micro-batch. Otherwise auto starts even and
// measures again; even and weights follow the config, whatever the checkpoint's split.
std::vector<std::int64_t> Checkpointer::resumed_shares(const CheckpointMeta& meta) const {
  const DataConfig& d = config_.data;
  if (d.balance != BalanceMode::kAuto || meta.shares_rule != name_of(BalanceMode::kAuto) ||
      meta.world_size != env_.world_size || meta.shares.size() != d.shares.size()) {
    return {};
  }
  std::int64_t sum = 0;
  for (std::int64_t b : meta.shares) {
    if (b < 1) return {};
    sum += b;
  }
  return sum == micro_batch_size(config_) ? meta.shares : std::vector<std::int64_t>{};
}

void Checkpointer::attach(CheckpointState& state) {
  states_.push_back(&state);
  auto it = resumed_states_.find(state.key());
  if (it == resumed_states_.end()) return;
  state.load(it->second, resumed_path_);
  resumed_states_.erase(it);
}

std::string Checkpointer::choose_checkpoint() const {
  const ResumeFrom& resume = config_.checkpoint.resume;
  if (resume.mode == ResumeMode::kNever) return "";
  if (resume.mode == ResumeMode::kPath) return resume.path;
  const auto manifest = read_manifest(dir_);
  if (!manifest) return "";
  const std::string path = dir_ + "/" + manifest->file;
  PARTRAIN_CHECK(fs::exists(path), UsageError, "checkpoint manifest ", manifest_path(dir_),
                 " names ", path, ", which does not exist");
  return path;
}

// Rank 0 chooses and reads; the others receive its bytes, or word that there are none.
Checkpointer::Fetched Checkpointer::fetch_checkpoint(const torch::nn::Module& model,
                                                     comm::Communicator* comm) const {
  comm::Communicator* shared = comm != nullptr && comm->size() > 1 ? comm : nullptr;
  Fetched fetched;
  std::int64_t length = kFresh;
  if (env_.rank == 0) length = read_on_rank0(model, shared, fetched);
  if (shared != nullptr) {
    length = broadcast_bytes(*shared, model, length, &fetched.bytes);
    PARTRAIN_CHECK(length != kRank0Failed, UsageError,
                   "rank 0 could not load the checkpoint to resume from (its message says why)");
    if (env_.rank != 0 && length >= 0) {
      fetched.path = "rank 0's checkpoint (" + std::to_string(length) + " bytes)";
    }
  }
  fetched.fresh = length == kFresh;
  return fetched;
}

// The chosen checkpoint's length (kFresh: none). A failure here is told to the other ranks
// before it is thrown: they would wait for the checkpoint until the timeout.
std::int64_t Checkpointer::read_on_rank0(const torch::nn::Module& model, comm::Communicator* shared,
                                         Fetched& fetched) const {
  try {
    fetched.path = choose_checkpoint();
    if (fetched.path.empty()) return kFresh;
    fetched.bytes = read_checkpoint_file(fetched.path);
    return static_cast<std::int64_t>(fetched.bytes.size());
  } catch (const UsageError&) {
    if (shared != nullptr) broadcast_bytes(*shared, model, kRank0Failed, nullptr);
    throw;
  }
}

// Another world size continues the same training only in global-batch mode, at the same global
// batch split into the same micro-steps: then the epoch's samples and the position in it
// (micro-steps of M samples over all ranks) mean the same at any size (batch_plan.h).
void Checkpointer::check_fits_this_run(const CheckpointMeta& meta, const std::string& path) const {
  if (meta.world_size == env_.world_size) return;
  const std::int64_t global = config_.data.global_batch_size;
  PARTRAIN_CHECK(meta.global_batch_size > 0 && global > 0, UsageError, "checkpoint ", path,
                 " was written by a run of ", meta.world_size, " ranks; this run has ",
                 env_.world_size, " (a per-rank data.batch_size would change the global batch); ",
                 "use data.global_batch_size in both runs to resume at another world size, or ",
                 "checkpoint.resume: never to start afresh");
  PARTRAIN_CHECK(
      meta.global_batch_size == global && meta.accumulate_steps == config_.train.accumulate_steps,
      UsageError, "checkpoint ", path, " was written at data.global_batch_size ",
      meta.global_batch_size, " in ", meta.accumulate_steps,
      " micro-steps (train.accumulate_steps) by ", meta.world_size, " ranks; this run ", "of ",
      env_.world_size, " ranks has ", global, " in ", config_.train.accumulate_steps,
      "; use the same to resume at another world size, ",
      "or checkpoint.resume: never to start afresh");
}

}  // namespace partrain
