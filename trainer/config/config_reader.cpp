// YAML -> Config: one reader per section of the file, each reading its keys through a Section
// (yaml_section.h), so that every error names the key and where it came from. A check that
// needs a key of a section read earlier runs in the later section's reader;
// check_across_sections() holds those that need every key.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <sstream>
#include <tuple>

#include "comm_backends/algorithms/algorithm_choice.h"
#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "trainer/config/config.h"
#include "trainer/data/balance.h"
#include "trainer/config/yaml_section.h"

namespace partrain {
namespace {

// The schemes open_store() serves. env:// is checked for its shape only: MASTER_ADDR and
// MASTER_PORT belong to the environment the workers start in, not to this one.
std::string rendezvous_problem(const std::string& url) {
  if (url.rfind("env://", 0) == 0) {
    return url.size() == 6 ? ""
                           : "env:// takes nothing after it (MASTER_ADDR and MASTER_PORT "
                             "come from the environment)";
  }
  try {
    comm::parse_store_url(url);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

std::string host_problem(const std::string& host) {
  const std::string name = host.size() >= 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  const bool ipv6 = name.find(':') != std::string::npos;
  for (const char c : name) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
                    c == '_' || (ipv6 && (c == ':' || c == '%'));
    if (!ok) return "'" + host + "' is not a host name or IP address";
  }
  return name.empty() ? "empty host" : "";
}

std::string interface_problem(const std::string& name) {
  for (const char c : name) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/' || c == ':') {
      return "'" + name + "' is not a network interface name (e.g. eth0, ens5, ib0)";
    }
  }
  return "";
}

constexpr long long kMaxInt = std::numeric_limits<int>::max();
constexpr long long kMaxCount = 1LL << 40;
constexpr long long kMaxBatch = 1LL << 20;  // samples per rank and micro-step
constexpr std::size_t kMaxChannels = 64;
constexpr std::size_t kMaxRanks = 65536;  // data.balance's weights
constexpr double kMaxWeight = 1e12;

// Channels of the images a dataset yields (image-folder decodes everything as RGB, as
// torchvision's ImageFolder does); 0 where only the files know (tensors).
int dataset_channels(DatasetKind dataset) {
  switch (dataset) {
    case DatasetKind::kFashionMnist:
    case DatasetKind::kMnist:
      return 1;
    case DatasetKind::kTensors:
      return 0;
    case DatasetKind::kCifar100:
    case DatasetKind::kCifar10:
    case DatasetKind::kImageFolder:
    case DatasetKind::kSynthetic:
      return 3;
  }
  return 3;
}

// A key that belongs to other settings than the ones chosen, such as momentum with adamw, is
// an error rather than silently ignored.
void refuse(Section& section, const std::string& key, const std::string& why) {
  YAML::Node n = section.raw(key);
  if (n.IsDefined() && !n.IsNull()) fail(section.origins(), section.full(key), n.Mark(), why);
}

// launch.nproc_per_node: a count, `auto`, or one whole count per node.
void read_nproc_per_node(Section& launch, NodeLayout& out) {
  YAML::Node n = launch.raw("nproc_per_node");
  if (n.IsDefined() && n.IsScalar() && n.Scalar() == "auto") {
    out = NodeLayout::automatic();
  } else if (n.IsDefined() && n.IsSequence()) {
    std::vector<double> counts;
    launch.read_double_list("nproc_per_node", counts, 1, 1024, 65536);
    std::vector<int> per_node;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] != std::floor(counts[i])) {
        fail(launch.origins(), launch.full("nproc_per_node"), n[i].Mark(),
             detail::concat("item ", i, ": expected a whole number of ranks, got '", n[i].Scalar(),
                            "'"));
      }
      per_node.push_back(static_cast<int>(counts[i]));
    }
    out = NodeLayout::per_node(per_node);
  } else {
    int count = out.count();
    launch.read_int("nproc_per_node", count, 1, 1024);
    out = NodeLayout::every_node(count);
  }
}

void read_launch(Section launch, LaunchConfig& l) {
  read_nproc_per_node(launch, l.nproc_per_node);
  launch.read_int("nnodes", l.nnodes, 1, 65536);
  launch.read_checked("rendezvous", l.rendezvous, rendezvous_problem);
  launch.read_int("max_restarts", l.max_restarts, 0, 1000);
  launch.read_enum("bind", l.bind);
  launch.finish();
}

// comm.compression and its keys. PowerSGD compresses the Reducer's allreduce, which only
// strategy ddp has.
void read_compression(Section& comm, CommConfig& m, StrategyKind strategy) {
  const YAML::Node compression = comm.raw("compression");
  comm.read_enum("compression", m.compression);
  if (m.compression == Compression::kNone) {
    const std::string why = "applies to comm.compression powersgd only";
    refuse(comm, "powersgd_rank", why);
    refuse(comm, "powersgd_start_step", why);
    return;
  }
  comm.read_int("powersgd_rank", m.powersgd_rank, 1, 1024);
  comm.read_int("powersgd_start_step", m.powersgd_start_step, 0, kMaxCount);
  if (strategy != StrategyKind::kDdp) {
    fail(comm.origins(), "comm.compression", compression.Mark(),
         detail::concat("powersgd compresses the gradient allreduce of strategy ddp; strategy ",
                        name_of(strategy), " has none (use compression: none)"));
  }
}

void read_comm(Section comm, CommConfig& m, StrategyKind strategy) {
  comm.read("backend", m.backend, comm::backend_names());
  comm.read_double("bucket_mb", m.bucket_mb, 0.001, 4096);
  std::string wire_dtype;
  comm.read("wire_dtype", wire_dtype, {"f32", "f16", "bf16"});
  if (!wire_dtype.empty()) m.wire_dtype = comm::parse_dtype(wire_dtype);
  comm.read("algorithm", m.algorithm, comm::algorithm_request_names());
  comm.read_checked("tcp_congestion", m.tcp_congestion, comm::tcp_congestion_problem);
  comm.read_bool("shm_single_copy", m.shm_single_copy);
  comm.read_double("timeout_s", m.timeout_s, comm::kMinTimeoutSeconds, comm::kMaxTimeoutSeconds);
  comm.read_checked("interface", m.interface, interface_problem);
  comm.read_checked("host", m.host, host_problem);
  read_compression(comm, m, strategy);
  comm.finish();
}

// data.image_size, data.mean and data.std against the dataset they describe, each error at
// its key's place.
void check_data_shape(const Section& data, const DataConfig& d, const YAML::Node& image_size,
                      const YAML::Node& mean, const YAML::Node& std_dev) {
  if (d.image_size != 0 && d.dataset != DatasetKind::kImageFolder) {
    fail(data.origins(), "data.image_size", image_size.Mark(),
         detail::concat("resizing applies to data.dataset image-folder only, not ",
                        name_of(d.dataset), " (set it to 0 or remove it)"));
  }
  // Datasets whose channel count is fixed: a mean or std list of another length is caught here
  // with its place in the file; for tensors the count is known only once the file is read.
  const int channels = dataset_channels(d.dataset);
  for (const auto& [key, values, node] :
       {std::tuple{"mean", &d.mean, mean}, std::tuple{"std", &d.std, std_dev}}) {
    if (channels > 0 && !values->empty() && values->size() != 1 &&
        values->size() != static_cast<std::size_t>(channels)) {
      fail(data.origins(), std::string("data.") + key, node.Mark(),
           detail::concat(values->size(), " values, but ", name_of(d.dataset), " images have ",
                          channels,
                          channels == 1 ? std::string(" channel (give 1)")
                                        : detail::concat(" channels (give 1 or ", channels, ")")));
    }
  }
}

// data.balance: even | auto | a list of weights. The weights' count is checked against the
// world size once that is known (resolve_batch_size()).
void read_balance(Section& data, DataConfig& d) {
  const YAML::Node node = data.raw("balance");
  if (!node.IsDefined() || node.IsNull()) return;
  double number = 0;
  if (node.IsScalar() && !YAML::convert<double>::decode(node, number)) {
    const std::string text = data.read_text("balance").value_or("");
    if (text == name_of(BalanceMode::kEven)) {
      d.balance = BalanceMode::kEven;
    } else if (text == name_of(BalanceMode::kAuto)) {
      d.balance = BalanceMode::kAuto;
    } else {
      fail(data.origins(), "data.balance", node.Mark(),
           "'" + text + "' is not one of even | auto | a list of weights, one per rank");
    }
  } else {
    data.read_double_list("balance", d.balance_weights, -kMaxWeight, kMaxWeight, kMaxRanks);
    for (std::size_t r = 0; r < d.balance_weights.size(); ++r) {
      if (d.balance_weights[r] <= 0) {
        fail(data.origins(), "data.balance", node.IsSequence() ? node[r].Mark() : node.Mark(),
             detail::concat("rank ", r, "'s weight is ", d.balance_weights[r],
                            "; every weight must be > 0"));
      }
    }
    d.balance = BalanceMode::kWeights;
  }
  d.balance_at = data.origins().where("data.balance", node.Mark());
  if (d.balance != BalanceMode::kEven && d.global_batch_size == 0) {
    fail(data.origins(), "data.balance", node.Mark(),
         "needs data.global_batch_size (the samples per step that the ranks share); with a "
         "per-rank data.batch_size every rank takes the same");
  }
}

// Returns data.global_batch_size's node (null when absent), for the checks against train's keys.
YAML::Node read_data(Section data, DataConfig& d) {
  data.read_enum("dataset", d.dataset);
  data.read("root", d.root);
  data.read_bool("download", d.download);
  data.read("url", d.url);
  const YAML::Node batch = data.raw("batch_size");
  data.read_int("batch_size", d.batch_size, 1, kMaxBatch);
  const YAML::Node global = data.raw("global_batch_size");
  data.read_int("global_batch_size", d.global_batch_size, 1, kMaxCount);
  if (global.IsDefined() && !global.IsNull()) {
    if (batch.IsDefined() && !batch.IsNull()) {
      fail(data.origins(), "data.global_batch_size", global.Mark(),
           detail::concat("given with data.batch_size: ", d.global_batch_size,
                          " samples per step over all ranks, or ", d.batch_size,
                          " per rank; give one of the two"));
    }
    d.batch_size = 0;  // resolve_batch_size() sets the rank's share once the world size is known
    d.global_batch_size_at = data.origins().where("data.global_batch_size", global.Mark());
  }
  read_balance(data, d);
  data.read_int("num_workers", d.num_workers, 0, 64);
  data.read_bool("augment", d.augment);
  data.read_int("train_limit", d.train_limit, 0, kMaxCount);
  data.read_int("test_limit", d.test_limit, 0, kMaxCount);
  data.read_int("synthetic_train", d.synthetic_train, 1, 10'000'000);
  data.read_int("synthetic_test", d.synthetic_test, 1, 10'000'000);
  const YAML::Node image_size = data.raw("image_size");
  data.read_int("image_size", d.image_size, 0, 4096);
  // Pixels are in [0, 1] when normalised, so a mean far outside that is a typo (255 units).
  const YAML::Node mean = data.read_double_list("mean", d.mean, -1.0, 2.0, kMaxChannels);
  // std must be > 0; the smallest positive double stands for the open bound.
  const YAML::Node std_dev =
      data.read_double_list("std", d.std, std::numeric_limits<double>::min(), 100.0, kMaxChannels);
  data.finish();
  check_data_shape(data, d, image_size, mean, std_dev);
  return global;
}

// model.torchscript replaces the built-in models, so a built-in model's keys next to it would
// be silently ignored: an error instead; and the file must be there.
void check_torchscript(Section& model, const ModelConfig& m, const YAML::Node& torchscript) {
  if (m.torchscript.empty()) return;
  for (const char* key : {"name", "width", "norm"}) {
    refuse(model, key,
           "has no effect with model.torchscript (the saved module is the model); remove one "
           "of the two");
  }
  if (!std::filesystem::is_regular_file(m.torchscript)) {
    fail(model.origins(), "model.torchscript", torchscript.Mark(),
         "file '" + m.torchscript +
             "' does not exist (paths are relative to the working directory)");
  }
}

// model.sync_batchnorm needs BatchNorm layers it can reach and ranks to share statistics with.
void check_sync_batchnorm(const Section& model, const ModelConfig& m, StrategyKind strategy,
                          const YAML::Node& sync_batchnorm) {
  if (!m.sync_batchnorm) return;
  auto reject = [&](const std::string& why) {
    fail(model.origins(), "model.sync_batchnorm", sync_batchnorm.Mark(), why);
  };
  if (!m.torchscript.empty()) {
    reject(
        "not available with model.torchscript: its BatchNorm layers are compiled into the saved "
        "module, where partrain cannot replace them; set it false");
  }
  if (strategy == StrategyKind::kDp) {
    reject(
        "needs strategy ddp (or single, where it changes nothing): dp's replicas live in one "
        "process and normalise each device's piece on its own, as in PyTorch");
  }
  if (m.name == ModelName::kMlp || m.norm == Norm::kNone) {
    reject(detail::concat("model ", name_of(m.name),
                          m.name == ModelName::kMlp ? "" : " with norm: none",
                          " has no BatchNorm layers to synchronise"));
  }
}

void read_model(Section model, ModelConfig& m, StrategyKind strategy) {
  model.read_enum("name", m.name);
  model.read_int("width", m.width, 1, 4096);
  model.read_enum("norm", m.norm);
  const YAML::Node torchscript = model.raw("torchscript");
  model.read("torchscript", m.torchscript);
  const YAML::Node sync_batchnorm = model.raw("sync_batchnorm");
  model.read_bool("sync_batchnorm", m.sync_batchnorm);
  model.finish();
  check_torchscript(model, m, torchscript);
  check_sync_batchnorm(model, m, strategy, sync_batchnorm);
}

void read_optimizer(Section opt, OptimizerConfig& o) {
  opt.read_enum("name", o.name);
  if (o.name == OptimizerName::kAdamW) {  // PyTorch's defaults for AdamW
    o.lr = 1.0e-3;
    o.weight_decay = 0.01;
  }
  opt.read_double("lr", o.lr, 0.0, 1e6);
  opt.read_double("weight_decay", o.weight_decay, 0.0, 1e3);
  if (o.name == OptimizerName::kSgd) {
    opt.read_double("momentum", o.momentum, 0.0, 1.0);
    opt.read_bool("nesterov", o.nesterov);
    refuse(opt, "betas", "applies to optimizer adamw only, not sgd");
    refuse(opt, "eps", "applies to optimizer adamw only, not sgd");
    if (o.nesterov && o.momentum == 0.0) {
      fail(opt.origins(), opt.full("nesterov"), opt.raw("nesterov").Mark(),
           "Nesterov momentum needs momentum > 0");
    }
  } else {
    refuse(opt, "momentum", "applies to optimizer sgd only (adamw has betas)");
    // A config may say nesterov: false beside adamw; only true means something.
    bool nesterov = false;
    opt.read_bool("nesterov", nesterov);
    if (nesterov) refuse(opt, "nesterov", "applies to optimizer sgd only");
    std::vector<double> betas;
    const YAML::Node n = opt.read_double_list("betas", betas, 0.0, 0.999999, 2);
    if (!betas.empty()) {
      if (betas.size() != 2) {
        fail(opt.origins(), opt.full("betas"), n.Mark(), "expected two numbers [beta1, beta2]");
      }
      o.beta1 = betas[0];
      o.beta2 = betas[1];
    }
    opt.read_double("eps", o.eps, 1e-30, 1.0);
  }
  opt.finish();
}

void read_schedule(Section sched, ScheduleConfig& s, double lr) {
  sched.read_enum("name", s.name);
  sched.read_int("warmup_steps", s.warmup_steps, 0, kMaxCount);
  if (s.name == ScheduleName::kStep) {
    const YAML::Node n = sched.raw("step_size");
    sched.read_int("step_size", s.step_size, 1, kMaxCount);
    if (!n.IsDefined() || n.IsNull()) {
      fail(sched.origins(), sched.full("step_size"), sched.raw("name").Mark(),
           "schedule step needs step_size (optimizer steps between decays)");
    }
    sched.read_double("gamma", s.gamma, 0.0, 1.0);
  } else {
    const std::string not_step =
        detail::concat("applies to schedule step only, not ", name_of(s.name));
    refuse(sched, "step_size", not_step);
    refuse(sched, "gamma", not_step);
  }
  if (s.name == ScheduleName::kCosine) {
    const YAML::Node n = sched.raw("min_lr");
    sched.read_double("min_lr", s.min_lr, 0.0, 1e6);
    if (s.min_lr > lr) {
      std::ostringstream msg;
      msg << "min_lr " << s.min_lr << " is above the optimizer's lr " << lr;
      fail(sched.origins(), sched.full("min_lr"), n.Mark(), msg.str());
    }
  } else {
    refuse(sched, "min_lr",
           detail::concat("applies to schedule cosine only, not ", name_of(s.name)));
  }
  sched.finish();
}

void read_train(Section train, TrainConfig& t, DeviceChoice device, StrategyKind strategy,
                Compression compression) {
  train.read_int("epochs", t.epochs, 1, 100000);
  train.read_int("max_steps", t.max_steps, 0, kMaxCount);
  train.read_int("accumulate_steps", t.accumulate_steps, 1, 1 << 16);
  train.read_int("threads", t.threads, 0, 1024);
  train.read_int("log_every", t.log_every, 1, kMaxInt);
  train.read_double("label_smoothing", t.label_smoothing, 0.0, 1.0);
  train.read_double("clip_grad_norm", t.clip_grad_norm, 0.0, 1e9);
  const YAML::Node precision = train.raw("precision");
  train.read_enum("precision", t.precision);
  const YAML::Node shard = train.raw("shard");
  train.read_enum("shard", t.shard);
  read_optimizer(train.section("optimizer"), t.optimizer);
  read_schedule(train.section("schedule"), t.schedule, t.optimizer.lr);
  train.finish();
  if (t.precision == Precision::kF16 && device == DeviceChoice::kCpu) {
    fail(train.origins(), "train.precision", precision.Mark(),
         "f16 needs device cuda: autocast on the CPU computes in bf16 only (use precision bf16 "
         "or f32)");
  }
  // The loss scale changes from step to step, and an overflowing step's infinities would
  // enter PowerSGD's error buffers and factors for good.
  if (t.precision == Precision::kF16 && compression == Compression::kPowerSgd) {
    fail(train.origins(), "train.precision", precision.Mark(),
         "f16 (loss scaling) cannot be combined with comm.compression powersgd (use precision "
         "bf16 or f32)");
  }
  // Sharding splits the ranks' optimizer state and gradients: strategy ddp's ranks, whose
  // buckets it reduce-scatters. PowerSGD's buckets hold a low-rank approximation that every
  // rank decompresses whole, which no rank could keep only a slice of.
  if (t.shard != Shard::kNone && strategy != StrategyKind::kDdp) {
    fail(
        train.origins(), "train.shard", shard.Mark(),
        detail::concat("shards the optimizer state over the ranks of strategy ddp; strategy ",
                       name_of(strategy), " has one process holding everything (use shard: none)"));
  }
  if (t.shard != Shard::kNone && compression == Compression::kPowerSgd) {
    fail(train.origins(), "train.shard", shard.Mark(),
         "cannot be combined with comm.compression powersgd: PowerSGD's compressed gradients are "
         "rebuilt whole on every rank, so no rank can keep only its slice (use shard: none, or "
         "compression: none)");
  }
}

void read_checkpoint(Section ckpt, CheckpointConfig& k) {
  ckpt.read_int("every_epochs", k.every_epochs, 0, 100000);
  ckpt.read_int("every_steps", k.every_steps, 0, kMaxCount);
  ckpt.read_double("every_seconds", k.every_seconds, 0.0, 1e9);
  ckpt.read_int("keep", k.keep, 1, 100000);
  // auto | never | PATH; whether PATH exists is checked once every key is read.
  if (const std::optional<std::string> resume = ckpt.read_text("resume")) {
    k.resume = *resume == "auto"    ? ResumeFrom{ResumeMode::kAuto, ""}
               : *resume == "never" ? ResumeFrom{ResumeMode::kNever, ""}
                                    : ResumeFrom{ResumeMode::kPath, *resume};
  }
  ckpt.finish();
}

// observe.trace_steps: [first, last], two whole step numbers, a window of at most
// kMaxTraceSteps steps.
void read_observe(Section observe, ObserveConfig& o) {
  observe.read_bool("trace", o.trace);
  observe.read_bool("tensorboard", o.tensorboard);
  std::vector<double> steps;
  const YAML::Node n =
      observe.read_double_list("trace_steps", steps, 0, static_cast<double>(kMaxCount), 2);
  if (n.IsDefined() && !n.IsNull()) {
    auto reject = [&](const std::string& why) {
      fail(observe.origins(), observe.full("trace_steps"), n.Mark(), why);
    };
    if (steps.size() != 2) reject("expected two step numbers [first, last], e.g. [10, 29]");
    for (const double step : steps) {
      if (step != std::floor(step)) {
        reject(detail::concat("expected whole step numbers, got ", step));
      }
    }
    o.trace_first_step = static_cast<std::int64_t>(steps[0]);
    o.trace_last_step = static_cast<std::int64_t>(steps[1]);
    if (o.trace_last_step < o.trace_first_step) {
      reject(detail::concat("the last step ", o.trace_last_step, " is before the first ",
                            o.trace_first_step));
    }
    if (o.trace_last_step - o.trace_first_step + 1 > kMaxTraceSteps) {
      reject(detail::concat(o.trace_last_step - o.trace_first_step + 1,
                            " steps; a trace holds at most ", kMaxTraceSteps));
    }
  }
  observe.finish();
}

// The keys of the top level that are no section (name, seed, device, strategy, reference)
// around the sections, in the order the errors report them.
void read_config(Section& top, Config& c) {
  top.read("name", c.name);
  top.read_int("seed", c.seed, 0, std::numeric_limits<long long>::max());
  top.read_enum("device", c.device);
  top.read_enum("strategy", c.strategy);
  read_launch(top.section("launch"), c.launch);
  read_comm(top.section("comm"), c.comm, c.strategy);
  const YAML::Node global_batch = read_data(top.section("data"), c.data);
  read_model(top.section("model"), c.model, c.strategy);
  if (c.strategy == StrategyKind::kDp && c.data.balance == BalanceMode::kAuto) {
    throw UsageError(c.data.balance_at +
                     ": data.balance: auto measures the ranks of strategy ddp; strategy dp splits "
                     "its batch over its devices by a list of weights, one per device");
  }
  read_train(top.section("train"), c.train, c.device, c.strategy, c.comm.compression);
  // Every micro-step of an accumulation group holds the same number of samples.
  if (c.data.global_batch_size % c.train.accumulate_steps != 0) {
    fail(top.origins(), "data.global_batch_size", global_batch.Mark(),
         detail::concat(c.data.global_batch_size, " samples do not split into ",
                        c.train.accumulate_steps, " equal micro-steps (train.accumulate_steps ",
                        c.train.accumulate_steps, "); use a multiple of it"));
  }
  read_checkpoint(top.section("checkpoint"), c.checkpoint);
  read_observe(top.section("observe"), c.observe);
  Section output = top.section("output");
  output.read("dir", c.output_dir);
  output.finish();
  const YAML::Node reference = top.raw("reference");
  top.read("reference", c.reference);
  if (!c.reference.empty() && !std::filesystem::exists(c.reference)) {
    fail(top.origins(), "reference", reference.Mark(),
         "file '" + c.reference + "' does not exist (paths are relative to the working directory)");
  }
  top.finish();
}

// Checks that involve more than one section, once every key has been read.
void check_across_sections(const Origins& origins, const Config& c) {
  const ResumeFrom& resume = c.checkpoint.resume;
  if (resume.mode == ResumeMode::kPath && !std::filesystem::exists(resume.path)) {
    fail(origins, "checkpoint.resume", YAML::Mark::null_mark(),
         "'" + resume.path + "' is neither auto, never nor an existing checkpoint file");
  }
  const NodeLayout& nodes = c.launch.nproc_per_node;
  if (c.strategy == StrategyKind::kSingle &&
      (nodes.is_per_node() || (!nodes.is_auto() && nodes.count() > 1))) {
    fail(origins, "strategy", YAML::Mark::null_mark(),
         "strategy single runs one process; launch.nproc_per_node must be 1 (use strategy: ddp)");
  }
}

}  // namespace

std::int64_t micro_batch_size(const Config& config) {
  return config.data.global_batch_size / config.train.accumulate_steps;
}

void resolve_batch_size(Config& config, int world_size, int rank) {
  DataConfig& d = config.data;
  if (d.global_batch_size == 0) return;
  const std::int64_t micro = micro_batch_size(config);
  auto reject = [&](const std::string& why) {
    throw UsageError(detail::concat(d.global_batch_size_at, ": data.global_batch_size: ", why));
  };
  const std::string per_micro_step =
      config.train.accumulate_steps == 1
          ? detail::concat(micro, " samples per step")
          : detail::concat(micro, " samples per micro-step (", d.global_batch_size, " / ",
                           config.train.accumulate_steps, " accumulate_steps)");
  if (d.balance == BalanceMode::kWeights && config.strategy == StrategyKind::kDp) {
    // One process takes the batch; the weights split it over the devices (Strategy).
    d.shares.assign(1, micro);
  } else if (d.balance == BalanceMode::kWeights) {
    const auto weights = static_cast<int>(d.balance_weights.size());
    if (weights != world_size) {
      throw UsageError(detail::concat(d.balance_at, ": data.balance: ", weights,
                                      weights == 1 ? " weight for " : " weights for ", world_size,
                                      world_size == 1 ? " rank" : " ranks", "; give one per rank"));
    }
    try {
      d.shares = data::weighted_shares(micro, d.balance_weights);
    } catch (const UsageError& e) {
      throw UsageError(detail::concat(d.balance_at, ": data.balance: ", e.what()));
    }
  } else if (d.balance == BalanceMode::kAuto) {
    // Even as far as it goes; the first measurements move it.
    if (world_size < 1 || micro < world_size) {
      reject(
          detail::concat(per_micro_step, " cannot give each of ", world_size, " ranks a sample"));
    }
    d.shares = data::weighted_shares(micro, std::vector<double>(world_size, 1.0));
  } else {
    if (world_size < 1 || micro % world_size != 0) {
      reject(detail::concat(per_micro_step, " do not split evenly over ", world_size,
                            " ranks; use a multiple of ",
                            world_size * config.train.accumulate_steps));
    }
    d.shares.assign(static_cast<std::size_t>(world_size), micro / world_size);
  }
  const std::int64_t largest = *std::max_element(d.shares.begin(), d.shares.end());
  if (largest > kMaxBatch) {
    reject(detail::concat(per_micro_step, " over ", world_size, " ranks is ", largest,
                          d.balance == BalanceMode::kEven ? " per rank" : " for one rank",
                          ", above the ", kMaxBatch, " one rank may take"));
  }
  d.batch_size = static_cast<int>(d.shares.at(static_cast<std::size_t>(rank)));
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Origins origins;
  const YAML::Node root = load_yaml_document(path, overrides, origins);
  Config config;
  config.source = path;
  Section top(root, "", origins);
  read_config(top, config);
  check_across_sections(origins, config);
  // output.dir follows the name unless it is set.
  if (!root["output"].IsDefined() || !root["output"]["dir"].IsDefined()) {
    config.output_dir = "runs/" + config.name;
  }
  return config;
}

}  // namespace partrain
