#include "trainer/parity/reference.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/errors.h"

namespace partrain::parity {
namespace {

// A raw figure and the derived one the file states may differ by the rounding of the
// stated value (three decimals in the experiment's notes); more than this is a typo.
constexpr double kDerivedAgreement = 0.005;

// Reads a YAML mapping field by field with the file:line:col of each node, so that every
// message points at the faulty spot; the keys a section may hold are given up front and
// anything else is refused (a misspelt key would otherwise be silently ignored).
class YamlSection {
 public:
  YamlSection(const std::string& file, const YAML::Node& node, std::string where,
              std::set<std::string> allowed)
      : file_(file), node_(node), where_(std::move(where)) {
    if (!node_.IsMap()) fail(node_, "", "expected a mapping");
    for (const auto& item : node_) {
      const std::string key = item.first.Scalar();
      if (!allowed.count(key)) {
        std::string known;
        for (const auto& k : allowed) known += (known.empty() ? "" : ", ") + k;
        fail(item.first, key, "unknown key (known: " + known + ")");
      }
    }
  }

  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& what) const {
    fail_at(file_, at.Mark(), key_path(key), what);
  }

  [[noreturn]] static void fail_at(const std::string& file, const YAML::Mark& mark,
                                   const std::string& key, const std::string& what) {
    const int line = mark.line >= 0 ? mark.line + 1 : 1;
    const int column = mark.column >= 0 ? mark.column + 1 : 1;
    throw UsageError(
        detail::concat(file, ":", line, ":", column, ": ", key.empty() ? "" : key + ": ", what));
  }

  std::string key_path(const std::string& key) const {
    if (key.empty()) return where_;
    return where_.empty() ? key : where_ + "." + key;
  }

  bool has(const char* key) const { return static_cast<bool>(node_[key]); }
  YAML::Node get(const char* key) const { return node_[key]; }
  const YAML::Node& node() const { return node_; }

  YAML::Node required(const char* key) const {
    YAML::Node value = node_[key];
    if (!value) fail(node_, key, "missing");
    return value;
  }

  std::string string(const char* key, bool needed) const {
    YAML::Node value = needed ? required(key) : node_[key];
    if (!value) return {};
    if (!value.IsScalar()) fail(value, key, "expected a string");
    return value.Scalar();
  }

  std::optional<double> positive(const char* key, bool needed) const {
    YAML::Node value = needed ? required(key) : node_[key];
    if (!value) return std::nullopt;
    return positive_number(value, key);
  }

  double positive_number(const YAML::Node& value, const std::string& key) const {
    double number = 0.0;
    if (!value.IsScalar() || !YAML::convert<double>::decode(value, number) ||
        !std::isfinite(number)) {
      fail(value, key, "expected a number");
    }
    if (number <= 0.0) fail(value, key, "must be positive");
    return number;
  }

  std::optional<long long> integer(const char* key, long long minimum) const {
    YAML::Node value = node_[key];
    if (!value) return std::nullopt;
    long long number = 0;
    if (!value.IsScalar() || !YAML::convert<long long>::decode(value, number)) {
      fail(value, key, "expected an integer");
    }
    if (number < minimum) fail(value, key, "must be at least " + std::to_string(minimum));
    return number;
  }

  std::vector<double> positive_list(const char* key) const {
    YAML::Node value = node_[key];
    std::vector<double> out;
    if (!value) return out;
    if (!value.IsSequence()) fail(value, key, "expected a list of numbers");
    for (std::size_t i = 0; i < value.size(); ++i) {
      out.push_back(positive_number(value[i], std::string(key) + "[" + std::to_string(i) + "]"));
    }
    return out;
  }

 private:
  const std::string& file_;
  const YAML::Node node_;
  std::string where_;
};

ReferenceRun read_run(const std::string& file, const YAML::Node& node, const std::string& key,
                      bool parallel) {
  YamlSection s(file, node, key,
                parallel ? std::set<std::string>{"strategy", "devices", "batch_size_per_rank",
                                                 "num_workers", "seconds", "gpu_memory_mb"}
                         : std::set<std::string>{"devices", "batch_size", "num_workers", "seconds",
                                                 "gpu_memory_mb"});
  ReferenceRun run;
  if (parallel) {
    run.strategy = s.string("strategy", false);
    if (run.strategy.empty()) run.strategy = "ddp";
    if (run.strategy != "ddp" && run.strategy != "dp") {
      s.fail(s.get("strategy"), "strategy", "expected ddp or dp, found \"" + run.strategy + "\"");
    }
  } else {
    run.strategy = "single";
  }
  run.devices = static_cast<int>(s.integer("devices", 1).value_or(parallel ? 0 : 1));
  if (parallel && run.devices < 2) {
    s.fail(s.has("devices") ? s.get("devices") : s.node(), "devices",
           s.has("devices") ? "a parallel run needs at least 2 devices" : "missing");
  }
  if (!parallel && run.devices != 1)
    s.fail(s.get("devices"), "devices", "a single run has 1 device");
  if (auto batch = s.integer(parallel ? "batch_size_per_rank" : "batch_size", 1)) {
    run.batch_size = static_cast<int>(*batch);
  }
  if (auto workers = s.integer("num_workers", 0)) run.num_workers = static_cast<int>(*workers);
  run.seconds = s.positive("seconds", false);
  run.memory_mb = s.positive_list("gpu_memory_mb");
  if (!run.memory_mb.empty() && static_cast<int>(run.memory_mb.size()) != run.devices) {
    s.fail(s.get("gpu_memory_mb"), "gpu_memory_mb",
           "has " + std::to_string(run.memory_mb.size()) + " values for " +
               std::to_string(run.devices) + " devices");
  }
  return run;
}

// Takes the value computed from raw figures, checking a stated one against it; else the
// stated one.
std::optional<double> settle(const std::string& file, const YAML::Node& stated,
                             const std::string& key, std::optional<double> stated_value,
                             std::optional<double> computed, const std::string& how) {
  if (!computed) return stated_value;
  if (stated_value && std::fabs(*stated_value - *computed) > kDerivedAgreement * *computed) {
    char text[64];
    std::snprintf(text, sizeof text, "%.4f", *computed);
    YamlSection::fail_at(file, stated.Mark(), key,
                         "disagrees with " + how + " = " + text + " from the raw figures");
  }
  return computed;
}

}  // namespace

Reference load_reference(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw UsageError(detail::concat(path, ": cannot open the reference file"));
  } catch (const YAML::ParserException& e) {
    YamlSection::fail_at(path, e.mark, "", e.msg);
  }
  if (!root.IsMap())
    YamlSection::fail_at(path, root.Mark(), "", "expected a mapping of reference keys");

  YamlSection top(path, root, "",
                  {"name", "os", "backend", "dataset", "model", "epochs", "train_images",
                   "memory_source", "note", "single", "parallel", "derived", "tolerance"});
  Reference ref;
  ref.path = path;
  ref.name = top.string("name", true);
  ref.os = top.string("os", false);
  ref.backend = top.string("backend", false);
  ref.dataset = top.string("dataset", false);
  ref.model = top.string("model", false);
  ref.note = top.string("note", false);
  ref.memory_source = top.string("memory_source", false);
  if (auto epochs = top.integer("epochs", 1)) ref.epochs = static_cast<int>(*epochs);
  ref.train_images = top.integer("train_images", 1);

  if (top.has("single")) {
    ref.single = read_run(path, top.get("single"), "single", false);
  } else {
    ref.single.strategy = "single";
  }
  ref.parallel = read_run(path, top.required("parallel"), "parallel", true);

  std::optional<double> computed_speedup;
  if (ref.single.seconds && ref.parallel.seconds) {
    computed_speedup = *ref.single.seconds / *ref.parallel.seconds;
  }
  std::vector<double> computed_memory;
  std::optional<double> computed_balance;
  if (!ref.single.memory_mb.empty() && !ref.parallel.memory_mb.empty()) {
    for (double mb : ref.parallel.memory_mb)
      computed_memory.push_back(mb / ref.single.memory_mb[0]);
  }
  if (!ref.parallel.memory_mb.empty()) {
    const auto [lo, hi] =
        std::minmax_element(ref.parallel.memory_mb.begin(), ref.parallel.memory_mb.end());
    computed_balance = *lo / *hi;
  }

  ref.memory_ratio = computed_memory;
  ref.speedup = computed_speedup;
  if (top.has("derived")) {
    YamlSection d(path, top.get("derived"), "derived", {"speedup", "memory_ratio", "balance"});
    const std::vector<double> stated_memory = d.positive_list("memory_ratio");
    if (!stated_memory.empty() && static_cast<int>(stated_memory.size()) != ref.parallel.devices) {
      d.fail(d.get("memory_ratio"), "memory_ratio",
             "has " + std::to_string(stated_memory.size()) + " values for " +
                 std::to_string(ref.parallel.devices) + " devices");
    }
    if (computed_memory.empty()) {
      ref.memory_ratio = stated_memory;
    } else {
      for (std::size_t i = 0; i < stated_memory.size(); ++i) {
        settle(path, d.get("memory_ratio")[i], "derived.memory_ratio[" + std::to_string(i) + "]",
               stated_memory[i], computed_memory[i], "parallel / single gpu_memory_mb");
      }
    }
    if (!computed_balance && !ref.memory_ratio.empty()) {
      const auto [lo, hi] = std::minmax_element(ref.memory_ratio.begin(), ref.memory_ratio.end());
      computed_balance = *lo / *hi;
    }
    ref.speedup = settle(path, d.get("speedup"), "derived.speedup", d.positive("speedup", false),
                         computed_speedup, "single.seconds / parallel.seconds");
    computed_balance =
        settle(path, d.get("balance"), "derived.balance", d.positive("balance", false),
               computed_balance, "min / max of the parallel memory per device");
  }
  ref.balance = computed_balance;
  if (!ref.speedup) {
    top.fail(root, "",
             "the reference gives no speed-up: it needs single.seconds and "
             "parallel.seconds, or derived.speedup");
  }

  if (top.has("tolerance")) {
    YamlSection t(path, top.get("tolerance"), "tolerance",
                  {kSpeedup, kEfficiency, kMemoryRatio, kBalance});
    for (const auto& item : t.node()) {
      const std::string figure = item.first.Scalar();
      const bool has_figure = figure == kMemoryRatio ? !ref.memory_ratio.empty()
                              : figure == kBalance   ? ref.balance.has_value()
                                                     : ref.speedup.has_value();
      if (!has_figure) {
        t.fail(item.first, figure,
               "the reference has no " + figure + " figure to hold ours against");
      }
      YamlSection band(path, item.second, "tolerance." + figure, {"min", "max"});
      Tolerance tol;
      tol.min = band.positive("min", false);
      tol.max = band.positive("max", false);
      if (!tol.min && !tol.max) band.fail(item.second, "", "give min, max or both");
      if (tol.min && tol.max && *tol.min > *tol.max) {
        band.fail(band.get("min"), "min", "is above max");
      }
      ref.tolerance[figure] = tol;
    }
  }
  return ref;
}

}  // namespace partrain::parity
