// YAML -> Config. Every key is read through a Section, which knows the key's path and the
// place it came from (file:line:col, or the --set override that wrote it), so that every
// error names both. Keys a Section was never asked for are reported as unknown.
#include "trainer/config/config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain {
namespace {

// Where each override came from, by the key path it set, so errors can point at it.
struct Origins {
  std::string file;
  std::map<std::string, std::string> overrides;  // "data.batch_size" -> "--set data.batch_size=0"

  std::string where(const std::string& path, const YAML::Mark& mark) const {
    for (auto it = overrides.begin(); it != overrides.end(); ++it) {
      const std::string& key = it->first;
      if (path == key || path.rfind(key + ".", 0) == 0) return it->second;
    }
    if (mark.is_null()) return file;
    return detail::concat(file, ":", mark.line + 1, ":", mark.column + 1);
  }
};

// Where `text` stops being UTF-8 (a byte index), or npos when all of it is. JSON (report.json)
// and YAML both require UTF-8, so a string that is not cannot be carried through.
std::size_t invalid_utf8_at(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t extra = 0;
    unsigned min = 0;
    unsigned code = lead;
    if (lead < 0x80)
      extra = 0;
    else if ((lead & 0xe0) == 0xc0)
      extra = 1, min = 0x80, code = lead & 0x1f;
    else if ((lead & 0xf0) == 0xe0)
      extra = 2, min = 0x800, code = lead & 0x0f;
    else if ((lead & 0xf8) == 0xf0)
      extra = 3, min = 0x10000, code = lead & 0x07;
    else
      return i;
    if (i + extra >= text.size() && extra > 0) return i;  // cut off at the end
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return i;
      code = (code << 6) | (next & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8 either.
    if (code < min || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return i;
    i += extra + 1;
  }
  return std::string::npos;
}

[[noreturn]] void fail(const Origins& origins, const std::string& path, const YAML::Mark& mark,
                       const std::string& what) {
  throw UsageError(detail::concat(origins.where(path, mark), ": ", path, ": ", what));
}

class Section {
 public:
  Section(YAML::Node node, std::string path, const Origins& origins)
      : node_(std::move(node)), path_(std::move(path)), origins_(origins) {
    if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
      fail(origins_, path_.empty() ? "(top level)" : path_, node_.Mark(),
           "expected a mapping of keys");
    }
    // yaml-cpp keeps the first of two equal keys and drops the second without a word; a
    // config that says a thing twice is ambiguous, so it is an error here.
    if (node_.IsDefined() && node_.IsMap()) {
      std::map<std::string, YAML::Mark> first_seen;
      for (const auto& kv : node_) {
        auto [it, inserted] = first_seen.emplace(kv.first.Scalar(), kv.first.Mark());
        if (!inserted) {
          fail(origins_, full(kv.first.Scalar()), kv.first.Mark(),
               detail::concat("duplicate key (first set at line ", it->second.line + 1, ")"));
        }
      }
    }
  }

  Section section(const std::string& key) { return Section(child(key), full(key), origins_); }

  void read(const std::string& key, std::string& out,
            std::initializer_list<const char*> allowed = {}) {
    YAML::Node n = child(key);
    if (!present(n)) return;
    if (!n.IsScalar()) fail(origins_, full(key), n.Mark(), "expected a string");
    std::string value = n.Scalar();
    if (const auto bad = invalid_utf8_at(value); bad != std::string::npos) {
      fail(origins_, full(key), n.Mark(),
           detail::concat("not UTF-8 text (byte ", bad, " of the value)"));
    }
    if (allowed.size() > 0) {
      bool ok = false;
      std::string list;
      for (const char* a : allowed) {
        ok = ok || value == a;
        list += list.empty() ? a : std::string(" | ") + a;
      }
      if (!ok) fail(origins_, full(key), n.Mark(), "'" + value + "' is not one of " + list);
    }
    out = value;
  }

  // A string that `problem` accepts: it returns what is wrong with a value, or "".
  void read_checked(const std::string& key, std::string& out,
                    const std::function<std::string(const std::string&)>& problem) {
    std::string value;
    read(key, value);
    if (value.empty()) return;
    if (const std::string what = problem(value); !what.empty()) {
      fail(origins_, full(key), child(key).Mark(), what);
    }
    out = value;
  }

  template <typename Int>
  void read_int(const std::string& key, Int& out, long long min, long long max) {
    YAML::Node n = child(key);
    if (!present(n)) return;
    long long value = 0;
    if (!n.IsScalar() || !YAML::convert<long long>::decode(n, value)) {
      fail(origins_, full(key), n.Mark(),
           "expected an integer, got '" +
               (n.IsScalar() ? n.Scalar() : std::string("a collection")) + "'");
    }
    check_range(key, n, static_cast<double>(value), static_cast<double>(min),
                static_cast<double>(max));
    out = static_cast<Int>(value);
  }

  void read_double(const std::string& key, double& out, double min, double max) {
    YAML::Node n = child(key);
    if (!present(n)) return;
    double value = 0;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, value) || !std::isfinite(value)) {
      fail(origins_, full(key), n.Mark(),
           "expected a number, got '" + (n.IsScalar() ? n.Scalar() : std::string("a collection")) +
               "'");
    }
    check_range(key, n, value, min, max);
    out = value;
  }

  void read_bool(const std::string& key, bool& out) {
    YAML::Node n = child(key);
    if (!present(n)) return;
    bool value = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, value)) {
      fail(origins_, full(key), n.Mark(), "expected true or false, got '" + n.Scalar() + "'");
    }
    out = value;
  }

  // A list of finite numbers, each in [min, max]; a single number is a list of one. Returns
  // the node (null when absent) so that callers can point at it.
  YAML::Node read_double_list(const std::string& key, std::vector<double>& out, double min,
                              double max, std::size_t max_count) {
    YAML::Node n = child(key);
    if (!present(n)) return YAML::Node();
    std::vector<YAML::Node> items;
    if (n.IsScalar()) {
      items.push_back(n);
    } else if (n.IsSequence()) {
      for (const auto& item : n) items.push_back(item);
    } else {
      fail(origins_, full(key), n.Mark(), "expected a number or a list of numbers");
    }
    if (items.empty() || items.size() > max_count) {
      fail(origins_, full(key), n.Mark(),
           detail::concat("expected 1 to ", max_count, " numbers, got ", items.size()));
    }
    std::vector<double> values;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const YAML::Node& item = items[i];
      double value = 0;
      if (!item.IsScalar() || !YAML::convert<double>::decode(item, value) ||
          !std::isfinite(value)) {
        fail(origins_, full(key), item.Mark(),
             detail::concat("item ", i, ": expected a number, got '",
                            item.IsScalar() ? item.Scalar() : std::string("a collection"), "'"));
      }
      if (value < min || value > max) {
        std::ostringstream msg;
        msg << "item " << i << ": " << item.Scalar() << " is out of range " << (min > 0 ? "(" : "[")
            << (min > 0 ? 0.0 : min) << ", " << max << "]";
        fail(origins_, full(key), item.Mark(), msg.str());
      }
      values.push_back(value);
    }
    out = values;
    return n;
  }

  // The node itself, for keys that accept more than one shape.
  YAML::Node raw(const std::string& key) { return child(key); }
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const Origins& origins() const { return origins_; }

  // Reports the first key that no reader asked for.
  void finish() const {
    if (!node_.IsDefined() || !node_.IsMap()) return;
    for (const auto& kv : node_) {
      std::string key = kv.first.Scalar();
      if (!asked_.count(key)) {
        std::string known;
        for (const auto& k : asked_) known += (known.empty() ? "" : ", ") + k;
        fail(origins_, full(key), kv.first.Mark(), "unknown key (known here: " + known + ")");
      }
    }
  }

 private:
  YAML::Node child(const std::string& key) {
    asked_.insert(key);
    if (!node_.IsDefined() || node_.IsNull()) return YAML::Node();
    return node_[key];
  }
  static bool present(const YAML::Node& n) { return n.IsDefined() && !n.IsNull(); }

  void check_range(const std::string& key, const YAML::Node& n, double value, double min,
                   double max) {
    if (value < min || value > max) {
      auto text = [](double v) {
        std::ostringstream out;
        if (std::abs(v) < 1e15 && v == std::floor(v)) {
          out << static_cast<long long>(v);
        } else {
          out << v;
        }
        return out.str();
      };
      std::ostringstream msg;
      msg << n.Scalar() << " is out of range [" << text(min) << ", " << text(max) << "]";
      fail(origins_, full(key), n.Mark(), msg.str());
    }
  }

  YAML::Node node_;
  std::string path_;
  const Origins& origins_;
  std::set<std::string> asked_;
};

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
constexpr std::size_t kMaxChannels = 64;

// Channels of the images a dataset yields (image-folder decodes everything as RGB, as
// torchvision's ImageFolder does); 0 where only the files know (tensors).
int dataset_channels(const std::string& dataset) {
  if (dataset == "fashion-mnist" || dataset == "mnist") return 1;
  if (dataset == "tensors") return 0;
  return 3;
}
constexpr long long kMaxCount = 1LL << 40;

// A key that belongs to other settings than the ones chosen, such as momentum with adamw, is
// an error rather than silently ignored.
void refuse(Section& section, const std::string& key, const std::string& why) {
  YAML::Node n = section.raw(key);
  if (n.IsDefined() && !n.IsNull()) fail(section.origins(), section.full(key), n.Mark(), why);
}

// model.torchscript replaces the built-in models, so a built-in model's keys next to it would
// be silently ignored: an error instead. model.sync_batchnorm needs BatchNorm layers it can
// reach and ranks to share statistics with.
void read_model_choice(Section& model, const Config& c, const YAML::Node& torchscript,
                       const YAML::Node& sync_batchnorm) {
  if (!c.model.torchscript.empty()) {
    for (const char* key : {"name", "width", "norm"}) {
      refuse(model, key,
             "has no effect with model.torchscript (the saved module is the model); remove one "
             "of the two");
    }
    if (!std::filesystem::is_regular_file(c.model.torchscript)) {
      fail(model.origins(), "model.torchscript", torchscript.Mark(),
           "file '" + c.model.torchscript +
               "' does not exist (paths are relative to the working directory)");
    }
  }
  if (!c.model.sync_batchnorm) return;
  auto reject = [&](const std::string& why) {
    fail(model.origins(), "model.sync_batchnorm", sync_batchnorm.Mark(), why);
  };
  if (!c.model.torchscript.empty()) {
    reject(
        "not available with model.torchscript: its BatchNorm layers are compiled into the saved "
        "module, where partrain cannot replace them; set it false");
  }
  if (c.strategy == "dp") {
    reject(
        "needs strategy ddp (or single, where it changes nothing): dp's replicas live in one "
        "process and normalise each device's piece on its own, as in PyTorch");
  }
  if (c.model.name == "mlp" || c.model.norm == "none") {
    reject("model " + c.model.name + (c.model.name == "mlp" ? "" : " with norm: none") +
           " has no BatchNorm layers to synchronise");
  }
}

void read_optimizer(Section opt, OptimizerConfig& o) {
  opt.read("name", o.name, {"sgd", "adamw"});
  if (o.name == "adamw") {  // PyTorch's defaults for AdamW
    o.lr = 1.0e-3;
    o.weight_decay = 0.01;
  }
  opt.read_double("lr", o.lr, 0.0, 1e6);
  opt.read_double("weight_decay", o.weight_decay, 0.0, 1e3);
  if (o.name == "sgd") {
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
    // DESIGN.md's example writes nesterov: false beside adamw; only true means something.
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
  sched.read("name", s.name, {"constant", "step", "cosine"});
  sched.read_int("warmup_steps", s.warmup_steps, 0, kMaxCount);
  if (s.name == "step") {
    const YAML::Node n = sched.raw("step_size");
    sched.read_int("step_size", s.step_size, 1, kMaxCount);
    if (!n.IsDefined() || n.IsNull()) {
      fail(sched.origins(), sched.full("step_size"), sched.raw("name").Mark(),
           "schedule step needs step_size (optimizer steps between decays)");
    }
    sched.read_double("gamma", s.gamma, 0.0, 1.0);
  } else {
    refuse(sched, "step_size", "applies to schedule step only, not " + s.name);
    refuse(sched, "gamma", "applies to schedule step only, not " + s.name);
  }
  if (s.name == "cosine") {
    const YAML::Node n = sched.raw("min_lr");
    sched.read_double("min_lr", s.min_lr, 0.0, 1e6);
    if (s.min_lr > lr) {
      std::ostringstream msg;
      msg << "min_lr " << s.min_lr << " is above the optimizer's lr " << lr;
      fail(sched.origins(), sched.full("min_lr"), n.Mark(), msg.str());
    }
  } else {
    refuse(sched, "min_lr", "applies to schedule cosine only, not " + s.name);
  }
  sched.finish();
}

void read_config(Section& top, Config& c) {
  top.read("name", c.name);
  top.read_int("seed", c.seed, 0, std::numeric_limits<long long>::max());
  top.read("device", c.device, {"cuda", "cpu", "auto"});
  top.read("strategy", c.strategy, {"ddp", "dp", "single"});

  Section launch = top.section("launch");
  {
    YAML::Node n = launch.raw("nproc_per_node");
    if (n.IsDefined() && n.IsScalar() && n.Scalar() == "auto") {
      c.launch.nproc_auto = true;
    } else if (n.IsDefined() && n.IsSequence()) {
      std::vector<double> counts;
      launch.read_double_list("nproc_per_node", counts, 1, 1024, 65536);
      for (std::size_t i = 0; i < counts.size(); ++i) {
        if (counts[i] != std::floor(counts[i])) {
          fail(launch.origins(), launch.full("nproc_per_node"), n[i].Mark(),
               detail::concat("item ", i, ": expected a whole number of ranks, got '",
                              n[i].Scalar(), "'"));
        }
        c.launch.node_sizes.push_back(static_cast<int>(counts[i]));
      }
    } else {
      launch.read_int("nproc_per_node", c.launch.nproc_per_node, 1, 1024);
    }
  }
  launch.read_int("nnodes", c.launch.nnodes, 1, 65536);
  launch.read_checked("rendezvous", c.launch.rendezvous, rendezvous_problem);
  launch.read_int("max_restarts", c.launch.max_restarts, 0, 1000);
  launch.finish();

  Section comm = top.section("comm");
  comm.read("backend", c.comm.backend,
            {"gloo", "asio-ring", "shm", "hierarchical", "nccl", "auto"});
  comm.read_double("bucket_mb", c.comm.bucket_mb, 0.001, 4096);
  comm.read("wire_dtype", c.comm.wire_dtype, {"f32", "f16", "bf16"});
  comm.read_double("timeout_s", c.comm.timeout_s, 0.1, 86400.0 * 7);
  comm.read_checked("interface", c.comm.interface, interface_problem);
  comm.read_checked("host", c.comm.host, host_problem);
  comm.finish();

  Section data = top.section("data");
  data.read(
      "dataset", c.data.dataset,
      {"cifar100", "cifar10", "fashion-mnist", "mnist", "image-folder", "tensors", "synthetic"});
  data.read("root", c.data.root);
  data.read_bool("download", c.data.download);
  data.read("url", c.data.url);
  data.read_int("batch_size", c.data.batch_size, 1, 1 << 20);
  data.read_int("num_workers", c.data.num_workers, 0, 64);
  data.read_bool("augment", c.data.augment);
  data.read_int("train_limit", c.data.train_limit, 0, kMaxCount);
  data.read_int("test_limit", c.data.test_limit, 0, kMaxCount);
  data.read_int("synthetic_train", c.data.synthetic_train, 1, 10'000'000);
  data.read_int("synthetic_test", c.data.synthetic_test, 1, 10'000'000);
  const YAML::Node image_size = data.raw("image_size");
  data.read_int("image_size", c.data.image_size, 0, 4096);
  // Pixels are in [0, 1] when normalised, so a mean far outside that is a typo (255 units).
  const YAML::Node mean = data.read_double_list("mean", c.data.mean, -1.0, 2.0, kMaxChannels);
  // std must be > 0; the smallest positive double stands for the open bound.
  const YAML::Node std_dev = data.read_double_list(
      "std", c.data.std, std::numeric_limits<double>::min(), 100.0, kMaxChannels);
  data.finish();
  if (c.data.image_size != 0 && c.data.dataset != "image-folder") {
    fail(top.origins(), "data.image_size", image_size.Mark(),
         "resizing applies to data.dataset image-folder only, not " + c.data.dataset +
             " (set it to 0 or remove it)");
  }
  // Datasets whose channel count is fixed: a mean or std list of another length is caught here
  // with its place in the file; for tensors the count is known only once the file is read.
  const int channels = dataset_channels(c.data.dataset);
  for (const auto& [key, values, node] :
       {std::tuple{"mean", &c.data.mean, mean}, std::tuple{"std", &c.data.std, std_dev}}) {
    if (channels > 0 && !values->empty() && values->size() != 1 &&
        values->size() != static_cast<std::size_t>(channels)) {
      fail(
          top.origins(), std::string("data.") + key, node.Mark(),
          detail::concat(values->size(), " values, but ", c.data.dataset, " images have ", channels,
                         channels == 1 ? std::string(" channel (give 1)")
                                       : detail::concat(" channels (give 1 or ", channels, ")")));
    }
  }

  Section model = top.section("model");
  model.read("name", c.model.name, {"digitalnet", "resnet18", "mlp"});
  model.read_int("width", c.model.width, 1, 4096);
  model.read("norm", c.model.norm, {"batch", "none"});
  const YAML::Node torchscript = model.raw("torchscript");
  model.read("torchscript", c.model.torchscript);
  const YAML::Node sync_batchnorm = model.raw("sync_batchnorm");
  model.read_bool("sync_batchnorm", c.model.sync_batchnorm);
  model.finish();
  read_model_choice(model, c, torchscript, sync_batchnorm);

  Section train = top.section("train");
  train.read_int("epochs", c.train.epochs, 1, 100000);
  train.read_int("max_steps", c.train.max_steps, 0, kMaxCount);
  train.read_int("accumulate_steps", c.train.accumulate_steps, 1, 1 << 16);
  train.read_int("threads", c.train.threads, 0, 1024);
  train.read_int("log_every", c.train.log_every, 1, kMaxInt);
  train.read_double("label_smoothing", c.train.label_smoothing, 0.0, 1.0);
  train.read_double("clip_grad_norm", c.train.clip_grad_norm, 0.0, 1e9);
  const YAML::Node precision = train.raw("precision");
  train.read("precision", c.train.precision, {"f32", "bf16", "f16"});
  read_optimizer(train.section("optimizer"), c.train.optimizer);
  read_schedule(train.section("schedule"), c.train.schedule, c.train.optimizer.lr);
  train.finish();
  if (c.train.precision == "f16" && c.device == "cpu") {
    fail(top.origins(), "train.precision", precision.Mark(),
         "f16 needs device cuda: autocast on the CPU computes in bf16 only (use precision bf16 "
         "or f32)");
  }

  Section ckpt = top.section("checkpoint");
  ckpt.read_int("every_epochs", c.checkpoint.every_epochs, 0, 100000);
  ckpt.read_int("keep", c.checkpoint.keep, 1, 100000);
  ckpt.read("resume", c.checkpoint.resume);
  ckpt.finish();

  Section output = top.section("output");
  output.read("dir", c.output_dir);
  output.finish();

  {
    YAML::Node n = top.raw("reference");
    top.read("reference", c.reference);
    if (!c.reference.empty() && !std::filesystem::exists(c.reference)) {
      fail(top.origins(), "reference", n.Mark(),
           "file '" + c.reference +
               "' does not exist (paths are relative to the working directory)");
    }
  }
  top.finish();

  // Checks that involve more than one key.
  if (c.checkpoint.resume != "auto" && c.checkpoint.resume != "never" &&
      !std::filesystem::exists(c.checkpoint.resume)) {
    fail(top.origins(), "checkpoint.resume", YAML::Mark::null_mark(),
         "'" + c.checkpoint.resume + "' is neither auto, never nor an existing checkpoint file");
  }
  if (c.strategy == "single" && !c.launch.nproc_auto &&
      (c.launch.nproc_per_node > 1 || !c.launch.node_sizes.empty())) {
    fail(top.origins(), "strategy", YAML::Mark::null_mark(),
         "strategy single runs one process; launch.nproc_per_node must be 1 (use strategy: ddp)");
  }
}

// Applies "a.b.c=value" to the document; the value is parsed as YAML (so 3, true, [1,2]
// and "text" keep their types).
void apply_override(YAML::Node& root, const std::string& assignment, Origins& origins) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw UsageError("--set " + assignment + ": expected key.path=value");
  }
  std::string path = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw UsageError("--set " + assignment + ": value is not valid YAML: " + e.msg);
  }
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (part.empty()) throw UsageError("--set " + assignment + ": empty key in '" + path + "'");
    parts.push_back(part);
  }
  YAML::Node cur = root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = cur[parts[i]];
    } else if (!next.IsMap()) {
      throw UsageError("--set " + assignment + ": '" + parts[i] + "' is not a section");
    }
    cur.reset(next);
  }
  cur[parts.back()] = parsed;
  origins.overrides[path] = "--set " + assignment;
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Origins origins;
  origins.file = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path + ": cannot open config file");
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::ParserException& e) {
    throw UsageError(detail::concat(path, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                    ": not valid YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    throw UsageError(detail::concat(path, ":", root.Mark().line + 1, ":", root.Mark().column + 1,
                                    ": expected a mapping of config keys at the top level"));
  }
  for (const auto& o : overrides) apply_override(root, o, origins);

  Config config;
  config.source = path;
  config.output_dir = "runs/" + config.name;
  Section top(root, "", origins);
  read_config(top, config);
  if (!root["output"].IsDefined() || !root["output"]["dir"].IsDefined()) {
    config.output_dir = "runs/" + config.name;
  }
  return config;
}

namespace {

// The keys of the chosen optimizer and schedule only: the resolved config reads back as it
// was meant (a key of another optimizer would be refused).
nlohmann::ordered_json optimizer_json(const OptimizerConfig& o) {
  nlohmann::ordered_json j = {{"name", o.name}, {"lr", o.lr}, {"weight_decay", o.weight_decay}};
  if (o.name == "sgd") {
    j["momentum"] = o.momentum;
    j["nesterov"] = o.nesterov;
  } else {
    j["betas"] = {o.beta1, o.beta2};
    j["eps"] = o.eps;
  }
  return j;
}

nlohmann::ordered_json schedule_json(const ScheduleConfig& s) {
  nlohmann::ordered_json j = {{"name", s.name}, {"warmup_steps", s.warmup_steps}};
  if (s.name == "step") {
    j["step_size"] = s.step_size;
    j["gamma"] = s.gamma;
  }
  if (s.name == "cosine") j["min_lr"] = s.min_lr;
  return j;
}

}  // namespace

std::string config_to_json(const Config& c) {
  nlohmann::ordered_json j;
  j["name"] = c.name;
  j["seed"] = c.seed;
  j["device"] = c.device;
  j["strategy"] = c.strategy;
  j["launch"] = {{"nproc_per_node", c.launch.nproc_auto ? nlohmann::ordered_json("auto")
                                    : !c.launch.node_sizes.empty()
                                        ? nlohmann::ordered_json(c.launch.node_sizes)
                                        : nlohmann::ordered_json(c.launch.nproc_per_node)},
                 {"nnodes", c.launch.nnodes},
                 {"rendezvous", c.launch.rendezvous},
                 {"max_restarts", c.launch.max_restarts}};
  j["comm"] = {{"backend", c.comm.backend},       {"bucket_mb", c.comm.bucket_mb},
               {"wire_dtype", c.comm.wire_dtype}, {"timeout_s", c.comm.timeout_s},
               {"interface", c.comm.interface},   {"host", c.comm.host}};
  j["data"] = {{"dataset", c.data.dataset},
               {"root", c.data.root},
               {"download", c.data.download},
               {"url", c.data.url},
               {"batch_size", c.data.batch_size},
               {"num_workers", c.data.num_workers},
               {"augment", c.data.augment},
               {"train_limit", c.data.train_limit},
               {"test_limit", c.data.test_limit},
               {"synthetic_train", c.data.synthetic_train},
               {"synthetic_test", c.data.synthetic_test},
               {"image_size", c.data.image_size},
               {"mean", c.data.mean.empty() ? nlohmann::ordered_json(nullptr)
                                            : nlohmann::ordered_json(c.data.mean)},
               {"std", c.data.std.empty() ? nlohmann::ordered_json(nullptr)
                                          : nlohmann::ordered_json(c.data.std)}};
  // With a TorchScript model the built-in model's keys mean nothing: null, which reads back as
  // absent, so the resolved config loads again.
  const bool builtin = c.model.torchscript.empty();
  auto builtin_only = [builtin](const nlohmann::ordered_json& v) {
    return builtin ? v : nlohmann::ordered_json(nullptr);
  };
  j["model"] = {{"name", builtin_only(c.model.name)},
                {"width", builtin_only(c.model.width)},
                {"norm", builtin_only(c.model.norm)},
                {"torchscript", builtin ? nlohmann::ordered_json(nullptr)
                                        : nlohmann::ordered_json(c.model.torchscript)},
                {"sync_batchnorm", c.model.sync_batchnorm}};
  j["train"] = {{"epochs", c.train.epochs},
                {"max_steps", c.train.max_steps},
                {"accumulate_steps", c.train.accumulate_steps},
                {"optimizer", optimizer_json(c.train.optimizer)},
                {"schedule", schedule_json(c.train.schedule)},
                {"label_smoothing", c.train.label_smoothing},
                {"clip_grad_norm", c.train.clip_grad_norm},
                {"precision", c.train.precision},
                {"threads", c.train.threads},
                {"log_every", c.train.log_every}};
  j["checkpoint"] = {{"every_epochs", c.checkpoint.every_epochs},
                     {"keep", c.checkpoint.keep},
                     {"resume", c.checkpoint.resume}};
  j["output"] = {{"dir", c.output_dir}};
  j["reference"] =
      c.reference.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(c.reference);
  return j.dump();
}

namespace {
// JSON and YAML share their data model for everything a config holds, so the YAML form is
// made from the JSON one: one list of keys to keep in step with read_config, not two.
void emit_json(YAML::Emitter& out, const nlohmann::ordered_json& j) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      out << YAML::Key << k << YAML::Value;
      emit_json(out, v);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& v : j) emit_json(out, v);
    out << YAML::EndSeq;
  } else if (j.is_null()) {
    out << YAML::Null;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<long long>();
  } else if (j.is_number_unsigned()) {
    out << j.get<unsigned long long>();
  } else if (j.is_number_float()) {
    out << j.get<double>();
  } else {
    out << j.get<std::string>();
  }
}
}  // namespace

std::string config_to_yaml(const Config& config) {
  YAML::Emitter out;
  emit_json(out, nlohmann::ordered_json::parse(config_to_json(config)));
  return std::string(out.c_str()) + "\n";
}

}  // namespace partrain
