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
// A checkpoint's dict: "format", "model" (the state dict), "meta" (JSON text: epoch, step,
// world size, model, loss scale, the epoch records, the global batch and its shares;
// CheckpointMeta), and the strategy's entries (Strategy::save_state): "optimizer" ({"name":
// "sgd" | "adamw", "state": {parameter name: {"momentum_buffer"} or {"step", "exp_avg",
// "exp_avg_sq"}}}, ReplicatedOptimizer::save) and, with PowerSGD, "powersgd" (its factors and
// error buffers). Checkpoints of earlier versions hold SGD's buffers under "momentum".
//
// Writing order: checkpoint to a temp name -> fsync -> rename; then the manifest the same
// way. A crash before the manifest's rename leaves the previous manifest, which still names
// a complete file; an orphaned temp file is ignored (and removed by the next save). So at
// any moment the manifest names a complete checkpoint, or there is no manifest.
#include "trainer/loop/checkpoint.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "comm_backends/communicator.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/stop_request.h"
#include "trainer/loop/pickle_file.h"
#include "trainer/model/train_model.h"
#include "trainer/observe/test_injection.h"
#include "trainer/optim/optimizer.h"
#include "trainer/optim/optimizer_state.h"
#include "trainer/parallel/strategy.h"
#include "trainer/parallel/strategy_state.h"
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

// The dict of a checkpoint's bytes, its format checked. Checkpoints of earlier versions hold
// "momentum" where later ones hold "optimizer" (upgrade_older_formats()).
// From the file itself where `bytes` is empty, else from the bytes rank 0 sent.
c10::impl::GenericDict unpickle_checkpoint(const std::vector<char>& bytes, const std::string& file,
                                           const std::string& path) {
  const c10::IValue loaded = bytes.empty() ? load_pickle_file(file) : load_pickle(bytes, path);
  check_checkpoint(loaded, path, /*exporting=*/false);
  return loaded.toGenericDict();
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

// What every rank resumes from: the checkpoint's bytes, its name for messages and its path on
// rank 0 (beside which the shards of a sharded run lie), or nothing.
struct Checkpointer::Fetched {
  bool fresh = true;  // nothing to resume from
  std::string path;
  std::string rank0_path;
  std::vector<char> bytes;
};

namespace {

// Broadcasts `root`'s `length` and, when it is >= 0, its `bytes` (into *bytes on the others),
// as int64 words: in place on the CPU, through `device`'s memory for a backend that reads only
// device memory (nccl).
std::int64_t broadcast_bytes(comm::Communicator& comm, const c10::Device& device, int root,
                             std::int64_t length, std::vector<char>* bytes) {
  const bool on_device = device.is_cuda() && collective_reads_device_memory(comm);
  const auto words_options = torch::TensorOptions()
                                 .dtype(torch::kInt64)
                                 .device(on_device ? device : c10::Device(at::kCPU));
  auto header = torch::full({1}, length, words_options);
  broadcast_tensor(comm, header, root);
  length = header.cpu().item<std::int64_t>();
  if (length < 0 || bytes == nullptr) return length;
  PARTRAIN_CHECK(static_cast<std::uint64_t>(length) <= kMaxCheckpointBytes, CommError, "rank ",
                 root, " announced a checkpoint of ", length, " bytes");
  const std::int64_t words = (length + 7) / 8;
  bytes->resize(static_cast<std::size_t>(words * 8));  // read_file_bytes() left room for this
  at::Tensor payload =
      at::from_blob(bytes->data(), {words}, torch::TensorOptions().dtype(torch::kInt64));
  if (on_device) {
    at::Tensor staged = payload.to(device);
    broadcast_tensor(comm, staged, root);
    if (comm.rank() != root) payload.copy_(staged.cpu());
  } else {
    broadcast_tensor(comm, payload, root);
  }
  bytes->resize(static_cast<std::size_t>(length));
  return length;
}

// A file's bytes with room for broadcast_bytes()'s last word.
std::vector<char> read_with_room(const std::string& path) {
  std::vector<char> bytes = read_file_bytes(path, kMaxCheckpointBytes);
  const std::size_t size = bytes.size();
  bytes.reserve((size + 7) / 8 * 8);
  return bytes;
}

}  // namespace

Checkpointer::Checkpointer(const Config& config, const WorkerEnv& env)
    : config_(config), env_(env), dir_(config.output_dir + "/checkpoints") {}

void Checkpointer::maybe_save(const TrainingPosition& at, const TrainModel& model,
                              Strategy& strategy, const std::vector<EpochRecord>& epochs) {
  const int epoch = at.epoch;
  const int every = config_.checkpoint.every_epochs;
  const bool due = every > 0 && (epoch % every == 0 || epoch == config_.train.epochs);
  // Every rank decides the same: the test accuracies are sums over the ranks (evaluate()),
  // the same bits on every rank. That matters because saving is collective (the strategy's
  // save_state(), a sharded run's barrier) once something is written.
  bool best = !epochs.empty();
  for (std::size_t i = 0; i + 1 < epochs.size(); ++i)
    best = best && epochs.back().test_accuracy > epochs[i].test_accuracy;
  if (!due && !best) return;
  save(due ? checkpoint_file_name(epoch) : "", best, at, model, strategy, epochs);
}

std::string Checkpointer::save_step(const TrainingPosition& at, const TrainModel& model,
                                    Strategy& strategy, const std::vector<EpochRecord>& epochs) {
  const std::string name = checkpoint_file_name(at.epoch, at.step);
  save(name, false, at, model, strategy, epochs);
  return name;
}

// Every rank. A sharded strategy's ranks each write their shard first; only once every shard is
// on disk (a barrier) does rank 0 write the checkpoint's dict and the manifest that names it, so
// that latest.json never names a checkpoint whose shards are not all whole.
void Checkpointer::save(const std::string& name, bool best, const TrainingPosition& at,
                        const TrainModel& model, Strategy& strategy,
                        const std::vector<EpochRecord>& epochs) {
  comm::Communicator* comm = strategy.comm();
  StrategyState state;
  strategy.save_state(state, env_.rank == 0);
  const bool sharded = state.shard.has_value();
  if (env_.rank == 0 || sharded) fs::create_directories(dir_);
  if (sharded) {
    const int world = env_.world_size;
    if (!name.empty()) {
      write_pickle_atomically(dir_ + "/" + shard_file_name(name, env_.rank, world), *state.shard);
    }
    if (best) {
      write_pickle_atomically(dir_ + "/" + shard_file_name("best.pt", env_.rank, world),
                              *state.shard);
    }
    state.shard.reset();
    if (comm != nullptr) comm->barrier();
  }
  if (env_.rank == 0) {
    const c10::IValue dict = checkpoint_dict(at, model.module(), epochs, state.entries);
    if (!name.empty()) write_checkpoint(name, at, dict);
    if (best) write_pickle_atomically(dir_ + "/best.pt", dict);
  }
  if (name.empty()) return;  // best.pt alone: no barrier, as before sharding
  last_save_ = std::chrono::steady_clock::now();
  if (comm != nullptr) comm->barrier();
  // Each rank's own shards go by the same rule as the checkpoints (rank 0's pruning, which may
  // see them all on a shared filesystem, removes the same ones).
  if (sharded && env_.rank != 0) prune_shards();
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
                                    const c10::IValue& dict) {
  const InjectedFaults faults = injected_faults(env_.rank);
  const int save = ++saves_;
  // Tests only (PARTRAIN_TEST_SAVE_FAULT): this save dies at the step named, as in a power cut.
  auto die_if = [&](SaveFault::Phase phase) {
    if (faults.save_fault.strikes(phase, save)) die_at_once();
  };
  die_if(SaveFault::Phase::kBefore);
  const std::string path = dir_ + "/" + name;
  const bool half = faults.save_fault.strikes(SaveFault::Phase::kWrite, save);
  const auto [temp, bytes] = write_pickle_temp(path, dict, half);
  die_if(SaveFault::Phase::kWrite);
  // Tests only (PARTRAIN_TEST_STOP_SAVE_DELAY): the stop's save held open, half done.
  if (StopRequest::requested() && faults.stop_save_delay_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(faults.stop_save_delay_s));
  }
  die_if(SaveFault::Phase::kRename);
  commit_file(temp, path);
  die_if(SaveFault::Phase::kManifest);
  write_manifest(dir_, {name, at.epoch, at.step, bytes});
  die_if(SaveFault::Phase::kPrune);
  prune_checkpoints();
}

// The checkpoint's dict: its tensors are the model's own (on the CPU), not copies.
c10::IValue Checkpointer::checkpoint_dict(
    const TrainingPosition& at, const torch::nn::Module& model,
    const std::vector<EpochRecord>& epochs,
    const std::vector<std::pair<std::string, c10::IValue>>& entries) const {
  CheckpointMeta meta;
  meta.epoch = at.epoch;
  meta.step = at.step;
  meta.world_size = env_.world_size;
  meta.model = name_of(config_.model.name);
  meta.width = config_.model.width;
  meta.norm = name_of(config_.model.norm);
  meta.seed = config_.seed;
  meta.optimizer = optimizer_name(config_.train.optimizer.name);
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
  for (const auto& [key, value] : entries) top.insert(key, value);
  top.insert("meta", meta_to_text(meta));
  return top;
}

// Keeps the newest checkpoint.keep checkpoints, with their shards; leftover temp files from a
// crash go too.
void Checkpointer::prune_checkpoints() const {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const auto file = entry.path().filename().string();
    if (is_checkpoint_file_name(file)) files.push_back(file);
    if (file.find(".tmp") != std::string::npos) fs::remove(entry.path());
  }
  std::sort(files.begin(), files.end());
  const std::size_t keep = static_cast<std::size_t>(config_.checkpoint.keep);
  if (files.size() <= keep) return;
  const std::set<std::string> gone(files.begin(), files.end() - static_cast<long>(keep));
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const auto file = entry.path().filename().string();
    const auto shard = parse_shard_file_name(file);
    if (gone.count(file) > 0 || (shard && gone.count(shard->file) > 0)) fs::remove(entry.path());
  }
}

// Ranks other than 0: their own shards of all but the newest checkpoint.keep checkpoints.
void Checkpointer::prune_shards() const {
  std::vector<std::pair<std::string, fs::path>> shards;
  std::set<std::string> checkpoints;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const auto shard = parse_shard_file_name(entry.path().filename().string());
    if (!shard || shard->rank != env_.rank || !is_checkpoint_file_name(shard->file)) continue;
    shards.emplace_back(shard->file, entry.path());
    checkpoints.insert(shard->file);
  }
  const std::size_t keep = static_cast<std::size_t>(config_.checkpoint.keep);
  if (checkpoints.size() <= keep) return;
  auto newest = checkpoints.end();
  std::advance(newest, -static_cast<long>(keep));
  for (const auto& [checkpoint, path] : shards) {
    if (checkpoint < *newest) fs::remove(path);
  }
}

// Where the run resumes is rank 0's decision alone: the hosts of a run need not share a
// filesystem, and ranks that read OUTPUT/checkpoints each on their own could start at
// different epochs, after which their collectives no longer match. So rank 0 picks the
// checkpoint (or "start fresh", or "failed"); every rank then loads that very file, read itself
// or sent by rank 0 (fetch_checkpoint()), through the same checks.
TrainingPosition Checkpointer::resume(TrainModel& model, Strategy& strategy) {
  const std::vector<at::Tensor> parameters = model.module().parameters();
  if (!parameters.empty()) device_ = parameters.front().device();
  Fetched fetched = fetch_checkpoint(strategy.comm());
  if (fetched.fresh) return TrainingPosition{};
  const std::string& path = fetched.path;
  SavedStrategyState saved;
  saved.path = path;
  saved.checkpoint = unpickle_checkpoint(fetched.bytes, fetched.rank0_path, path);
  fetched.bytes = std::vector<char>();  // the tensors are unpickled: the bytes may go
  upgrade_older_formats(saved.checkpoint);
  const CheckpointMeta meta = meta_from_text(saved.checkpoint.at("meta").toStringRef(), path);
  check_fits_this_run(meta, path);
  saved.written_by = meta.world_size;
  saved.shards = SavedOptimizerState::shards_of(saved.checkpoint.at("optimizer"), path);
  if (saved.shards > 0) {
    saved.read_shard = [this, &fetched, &strategy, &saved](int shard) {
      return read_shard(fetched.rank0_path, shard, saved.shards, strategy.comm());
    };
  }
  torch::NoGradGuard no_grad;  // loading writes into parameters, outside any graph
  reading_checkpoint(path, [&] {
    load_model(model.module(), saved.checkpoint, meta, path);
    strategy.load_state(saved);
  });
  previous_epochs_ = meta.epochs;
  TrainingPosition position = position_of(meta, path);
  position.shares = resumed_shares(meta);
  return position;
}

// Shard `shard` of `world` beside `checkpoint` (rank 0's path of it), read by one rank and
// broadcast to all: at the world size that wrote it, by the rank that wrote it (whose host has
// it, shared filesystem or not); at another, by rank 0, which then needs to see every shard (a
// shared filesystem, or one host). A rank that cannot read it says so to the others first.
c10::IValue Checkpointer::read_shard(const std::string& checkpoint, int shard, int world,
                                     comm::Communicator* comm) const {
  const int reader = world == env_.world_size ? shard : 0;
  const std::string name = shard_file_name(fs::path(checkpoint).filename().string(), shard, world);
  const fs::path dir = config_.checkpoint.resume.mode == ResumeMode::kPath
                           ? fs::path(config_.checkpoint.resume.path).parent_path()
                           : fs::path(dir_);
  const std::string path = (dir / name).string();
  std::vector<char> bytes;
  std::int64_t length = 0;
  std::string failure;
  if (env_.rank == reader) {
    try {
      bytes = read_with_room(path);
      length = static_cast<std::int64_t>(bytes.size());
    } catch (const UsageError& e) {
      failure = e.what();
      length = kRank0Failed;
    }
  }
  if (comm != nullptr && comm->size() > 1) {
    length = broadcast_bytes(*comm, device_, reader, length, &bytes);
  }
  PARTRAIN_CHECK(failure.empty(), UsageError, failure,
                 world == env_.world_size
                     ? ""
                     : " (a sharded checkpoint resumed at another world size is read on rank 0, "
                       "which must see every shard: one host or a shared filesystem)");
  PARTRAIN_CHECK(length >= 0, UsageError, "rank ", reader, " could not read checkpoint shard ",
                 name, " (its message says why)");
  return load_pickle(bytes, path);
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

// Rank 0 chooses; every rank that sees the same file (its size and hash are rank 0's: one
// host, or a shared filesystem) reads it itself, record by record; if any rank does not, rank 0
// reads the file's bytes and broadcasts them. Or word that there is nothing to resume from.
Checkpointer::Fetched Checkpointer::fetch_checkpoint(comm::Communicator* comm) const {
  comm::Communicator* shared = comm != nullptr && comm->size() > 1 ? comm : nullptr;
  Fetched fetched;
  std::int64_t length = kFresh;
  std::uint64_t hash = 0;
  if (env_.rank == 0) {
    // A failure here is told to the other ranks before it is thrown: they would wait for the
    // checkpoint until the timeout.
    try {
      fetched.path = choose_checkpoint();
      if (!fetched.path.empty()) {
        std::error_code ec;
        const auto size = fs::file_size(fetched.path, ec);
        PARTRAIN_CHECK(!ec, UsageError, "checkpoint ", fetched.path, ": cannot read (",
                       ec.message(), ")");
        PARTRAIN_CHECK(size <= kMaxCheckpointBytes, UsageError, "checkpoint ", fetched.path, ": ",
                       size, " bytes is larger than any checkpoint partrain writes");
        length = static_cast<std::int64_t>(size);
        if (shared != nullptr) hash = file_hash(fetched.path);
      }
    } catch (const UsageError&) {
      if (shared != nullptr) broadcast_bytes(*shared, device_, 0, kRank0Failed, nullptr);
      throw;
    }
    fetched.rank0_path = fetched.path;
  }
  if (shared == nullptr) {
    fetched.fresh = length == kFresh;
    return fetched;
  }
  length = broadcast_bytes(*shared, device_, 0, length, nullptr);
  PARTRAIN_CHECK(length != kRank0Failed, UsageError,
                 "rank 0 could not load the checkpoint to resume from (its message says why)");
  fetched.fresh = length == kFresh;
  if (fetched.fresh) return fetched;
  // Rank 0's path and the file's hash, then whether every rank sees that very file.
  std::vector<char> announced(fetched.rank0_path.begin(), fetched.rank0_path.end());
  announced.resize(announced.size() + sizeof(hash));
  std::memcpy(announced.data() + fetched.rank0_path.size(), &hash, sizeof(hash));
  announced.reserve((announced.size() + 7) / 8 * 8);
  broadcast_bytes(*shared, device_, 0, static_cast<std::int64_t>(announced.size()), &announced);
  std::memcpy(&hash, announced.data() + announced.size() - sizeof(hash), sizeof(hash));
  fetched.rank0_path.assign(announced.begin(), announced.end() - sizeof(hash));
  double sees_it = 1.0;
  if (env_.rank != 0 && injected_faults(env_.rank).own_disk) {
    sees_it = 0.0;
    fetched.path = "rank 0's checkpoint (" + std::to_string(length) + " bytes)";
  } else if (env_.rank != 0) {
    std::error_code ec;
    try {
      sees_it = fs::file_size(fetched.rank0_path, ec) == static_cast<std::uintmax_t>(length) &&
                        !ec && file_hash(fetched.rank0_path) == hash
                    ? 1.0
                    : 0.0;
    } catch (const UsageError&) {
      sees_it = 0.0;  // unreadable here: rank 0 sends it
    }
    fetched.path = "rank 0's checkpoint (" + std::to_string(length) + " bytes)";
  }
  std::vector<double> missing{1.0 - sees_it};
  sum_over_ranks(shared, missing, device_);
  if (missing[0] == 0.0) return fetched;  // every rank reads the file itself
  if (env_.rank == 0) fetched.bytes = read_with_room(fetched.path);
  broadcast_bytes(*shared, device_, 0, length, &fetched.bytes);
  return fetched;
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
