#include "trainer/report/report_format.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

Json number_or_null(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

}  // namespace

JsonAt::JsonAt(const Json& value, std::string document, std::string path)
    : value_(&value), document_(std::move(document)), path_(std::move(path)) {}

void JsonAt::fail(const std::string& what) const {
  throw UsageError(
      detail::concat(document_, ": ", path_.empty() ? "(top level)" : path_, ": ", what));
}

std::string JsonAt::type_of(const Json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_null()) return "null";
  return std::string(value.is_array() || value.is_object() ? "an " : "a ") + value.type_name();
}

JsonAt JsonAt::object() const {
  if (!value_->is_object()) fail("expected an object, found " + type_of(*value_));
  return *this;
}

JsonAt JsonAt::operator[](const char* key) const {
  object();
  const std::string child = path_.empty() ? key : path_ + "." + key;
  auto it = value_->find(key);
  if (it == value_->end()) JsonAt(*value_, document_, child).fail("missing");
  return JsonAt(*it, document_, child);
}

JsonAt JsonAt::at(std::size_t index) const {
  const std::size_t n = size();
  const std::string child = path_ + "[" + std::to_string(index) + "]";
  if (index >= n) JsonAt(*value_, document_, child).fail("missing");
  return JsonAt((*value_)[index], document_, child);
}

bool JsonAt::has(const char* key) const {
  return value_->is_object() && value_->find(key) != value_->end();
}

std::size_t JsonAt::size() const {
  if (!value_->is_array()) fail("expected an array, found " + type_of(*value_));
  return value_->size();
}

double JsonAt::number() const {
  if (!value_->is_number()) fail("expected a number, found " + type_of(*value_));
  return value_->get<double>();
}

double JsonAt::non_negative() const {
  const double value = number();
  if (!(value >= 0.0)) fail("must not be negative");
  return value;
}

double JsonAt::number_or_nan() const {
  if (value_->is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!value_->is_number()) fail("expected a number or null, found " + type_of(*value_));
  return value_->get<double>();
}

std::optional<double> JsonAt::number_or_null() const {
  if (value_->is_null()) return std::nullopt;
  if (!value_->is_number()) fail("expected a number or null, found " + type_of(*value_));
  return value_->get<double>();
}

int JsonAt::integer() const {
  if (!value_->is_number_integer()) fail("expected an integer, found " + type_of(*value_));
  const bool fits = value_->is_number_unsigned()
                        ? value_->get<std::uint64_t>() <=
                              static_cast<std::uint64_t>(std::numeric_limits<int>::max())
                        : value_->get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                              value_->get<std::int64_t>() <= std::numeric_limits<int>::max();
  if (!fits) fail("is out of range");
  return value_->get<int>();
}

std::int64_t JsonAt::count() const {
  if (!value_->is_number_integer()) fail("expected an integer, found " + type_of(*value_));
  if (value_->is_number_unsigned() &&
      value_->get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    fail("is out of range");
  }
  const std::int64_t value = value_->get<std::int64_t>();
  if (value < 0) fail("must not be negative");
  return value;
}

std::string JsonAt::string() const {
  if (!value_->is_string()) fail("expected a string, found " + type_of(*value_));
  return value_->get<std::string>();
}

bool JsonAt::boolean() const {
  if (!value_->is_boolean()) fail("expected true or false, found " + type_of(*value_));
  return value_->get<bool>();
}

std::optional<std::string> JsonAt::string_or_null() const {
  if (value_->is_null()) return std::nullopt;
  return string();
}

std::vector<std::string> JsonAt::strings() const {
  std::vector<std::string> out;
  const std::size_t n = size();
  for (std::size_t i = 0; i < n; ++i) out.push_back(at(i).string());
  return out;
}

Json epoch_to_json(const EpochRecord& e) {
  return Json{{"epoch", e.epoch},
              {"seconds", e.seconds},
              {"train_seconds", e.train_seconds},
              {"train_images_per_s", e.train_images_per_s},
              {"images", e.images},
              {"steps", e.steps},
              {"train_loss", e.train_loss},
              {"test_loss", e.test_loss},
              {"test_accuracy", e.test_accuracy},
              {"test_accuracy_top5", e.test_accuracy_top5},
              {"skipped_steps", e.skipped_steps}};
}

EpochRecord epoch_from_json(const JsonAt& j) {
  EpochRecord e;
  e.epoch = j["epoch"].integer();
  e.seconds = j["seconds"].non_negative();
  e.train_seconds = j["train_seconds"].non_negative();
  e.train_images_per_s = j["train_images_per_s"].non_negative();
  e.images = j["images"].count();
  e.steps = j["steps"].count();
  e.train_loss = j["train_loss"].number_or_nan();
  e.test_loss = j["test_loss"].number_or_nan();
  e.test_accuracy = j["test_accuracy"].number_or_nan();
  if (j.has("test_accuracy_top5")) e.test_accuracy_top5 = j["test_accuracy_top5"].number_or_nan();
  if (j.has("skipped_steps")) e.skipped_steps = j["skipped_steps"].count();
  return e;
}

EpochRecord epoch_from_json(const nlohmann::json& j) {
  const Json ordered(j);
  return epoch_from_json(JsonAt(ordered, "epoch record"));
}

double Breakdown::total() const {
  double sum = 0;
  for (const auto& [name, part] : kBreakdownParts) sum += this->*part;
  return sum;
}

Json breakdown_to_json(const Breakdown& b) {
  Json j = Json::object();
  for (const auto& [name, part] : kBreakdownParts) j[std::string(name)] = b.*part;
  j["total"] = b.total();
  return j;
}

Breakdown breakdown_from_json(const JsonAt& j) {
  Breakdown b;
  for (const auto& [name, part] : kBreakdownParts) {
    b.*part = j[std::string(name).c_str()].non_negative();
  }
  return b;
}

Json memory_to_json(const MemoryBreakdown& m) {
  Json j = Json::object();
  for (const auto& [name, part] : kMemoryParts) j[std::string(name)] = m.*part;
  return j;
}

MemoryBreakdown memory_from_json(const JsonAt& j) {
  MemoryBreakdown m;
  for (const auto& [name, part] : kMemoryParts) {
    const std::string key(name);
    m.*part = key == "unexplained_mb" ? j[key.c_str()].number() : j[key.c_str()].non_negative();
  }
  return m;
}

Json straggler_to_json(const std::optional<Straggler>& s) {
  if (!s) return Json(nullptr);
  return Json{{"rank", s->rank},
              {"steps_last", s->steps_last},
              {"steps", s->steps},
              {"seconds_cost", s->seconds_cost},
              {"kind", s->kind},
              {"steps_away", s->steps_away},
              {"median_step_seconds", s->median_step_seconds}};
}

std::optional<Straggler> straggler_from_json(const JsonAt& j) {
  if (j.json().is_null()) return std::nullopt;
  Straggler s;
  s.rank = j["rank"].integer();
  if (s.rank < 0) j["rank"].fail("must not be negative");
  s.steps_last = j["steps_last"].count();
  s.steps = j["steps"].count();
  if (s.steps_last > s.steps) j["steps_last"].fail("is more than steps");
  s.seconds_cost = j["seconds_cost"].non_negative();
  // kind, steps_away and median_step_seconds came later: absent, the rank was "slow".
  if (j.has("kind")) {
    s.kind = j["kind"].string();
    if (s.kind != "slow" && s.kind != "away") j["kind"].fail("must be slow or away");
  }
  if (j.has("steps_away")) s.steps_away = j["steps_away"].count();
  if (j.has("median_step_seconds")) s.median_step_seconds = j["median_step_seconds"].non_negative();
  return s;
}

Json rank_to_json(const RankRecord& r) {
  Json j{{"rank", r.rank},
         {"device", r.device},
         {"peak_rss_mb", r.peak_rss_mb},
         {"cuda_peak_allocated_mb", number_or_null(r.cuda_peak_allocated_mb)},
         {"cuda_peak_reserved_mb", number_or_null(r.cuda_peak_reserved_mb)},
         {"cuda_driver_used_mb", number_or_null(r.cuda_driver_used_mb)},
         {"compute_seconds", r.compute_seconds},
         {"comm_wait_seconds", r.comm_wait_seconds},
         {"comm_busy_seconds", r.comm_busy_seconds}};
  // Only for a rank that took part in gradient collectives, so that other reports (and those
  // written before these fields) read and write back as they were.
  if (r.comm_buckets > 0) {
    j["comm_bytes"] = r.comm_bytes;
    j["comm_buckets"] = r.comm_buckets;
  }
  if (r.threads > 0) {
    j["threads"] = r.threads;
    j["host_cores"] = r.host_cores;
    j["ranks_on_host"] = r.ranks_on_host;
  }
  if (r.breakdown) j["breakdown"] = breakdown_to_json(*r.breakdown);
  if (r.memory) j["memory"] = memory_to_json(*r.memory);
  return j;
}

RankRecord rank_from_json(const JsonAt& j) {
  RankRecord r;
  r.rank = j["rank"].integer();
  r.device = j["device"].string();
  r.peak_rss_mb = j["peak_rss_mb"].non_negative();
  r.cuda_peak_allocated_mb = j["cuda_peak_allocated_mb"].number_or_null();
  r.cuda_peak_reserved_mb = j["cuda_peak_reserved_mb"].number_or_null();
  r.cuda_driver_used_mb = j["cuda_driver_used_mb"].number_or_null();
  r.compute_seconds = j["compute_seconds"].non_negative();
  r.comm_wait_seconds = j["comm_wait_seconds"].non_negative();
  r.comm_busy_seconds = j["comm_busy_seconds"].non_negative();
  if (j.has("comm_bytes")) r.comm_bytes = j["comm_bytes"].count();
  if (j.has("comm_buckets")) r.comm_buckets = j["comm_buckets"].count();
  if (j.has("threads")) {
    r.threads = j["threads"].integer();
    r.host_cores = j["host_cores"].integer();
    r.ranks_on_host = j["ranks_on_host"].integer();
    if (r.threads < 1 || r.host_cores < 1 || r.ranks_on_host < 1) {
      j["threads"].fail("threads, host_cores and ranks_on_host must each be at least 1");
    }
  }
  if (j.has("breakdown")) r.breakdown = breakdown_from_json(j["breakdown"]);
  if (j.has("memory")) r.memory = memory_from_json(j["memory"]);
  return r;
}

Json env_to_json(const RunEnv& env) {
  return Json{{"os", env.os},
              {"libtorch", env.libtorch},
              {"backend", env.backend},
              {"world_size", env.world_size},
              {"strategy", env.strategy},
              {"devices", env.devices},
              {"cuda", env.cuda ? Json(*env.cuda) : Json(nullptr)}};
}

RunEnv env_from_json(const JsonAt& j) {
  RunEnv env;
  env.os = j["os"].string();
  env.libtorch = j["libtorch"].string();
  env.backend = j["backend"].string();
  env.world_size = j["world_size"].integer();
  if (env.world_size < 1) j["world_size"].fail("must be at least 1");
  env.strategy = j["strategy"].string();
  env.devices = j["devices"].strings();
  env.cuda = j["cuda"].string_or_null();
  return env;
}

Json compression_to_json(const CompressionRecord& c) {
  return Json{{"method", c.method},
              {"rank", c.rank},
              {"start_step", c.start_step},
              {"compressed_matrices", c.compressed_matrices},
              {"bytes_per_step", c.bytes_per_step},
              {"uncompressed_bytes_per_step", c.uncompressed_bytes_per_step}};
}

CompressionRecord compression_from_json(const JsonAt& j) {
  CompressionRecord c;
  c.method = j["method"].string();
  c.rank = j["rank"].integer();
  c.start_step = j["start_step"].count();
  c.compressed_matrices = j["compressed_matrices"].count();
  c.bytes_per_step = j["bytes_per_step"].count();
  c.uncompressed_bytes_per_step = j["uncompressed_bytes_per_step"].count();
  return c;
}

Json balance_to_json(const BalanceRecord& b) {
  Json changes = Json::array();
  for (const BalanceChangeRecord& c : b.changes) {
    Json change{{"step", c.step},
                {"shares", c.shares},
                {"seconds_per_sample", c.seconds_per_sample},
                {"running", c.running},
                {"predicted_before", c.predicted_before},
                {"predicted_after", c.predicted_after},
                {"step_seconds", c.step_seconds}};
    if (c.undo) {
      change["undo"] = true;
      change["before_move_seconds"] = c.before_move_seconds;
    }
    changes.push_back(change);
  }
  return Json{{"mode", b.mode}, {"shares", b.shares}, {"changes", changes}};
}

namespace {

std::vector<std::int64_t> shares_from_json(const JsonAt& j) {
  std::vector<std::int64_t> shares;
  for (std::size_t i = 0; i < j.size(); ++i) {
    shares.push_back(j.at(i).count());
    if (shares.back() < 1) j.at(i).fail("must be at least 1");
  }
  return shares;
}

}  // namespace

BalanceRecord balance_from_json(const JsonAt& j) {
  BalanceRecord b;
  b.mode = j["mode"].string();
  if (b.mode != "even" && b.mode != "weights" && b.mode != "auto") {
    j["mode"].fail("is \"" + b.mode + "\", expected even, weights or auto");
  }
  b.shares = shares_from_json(j["shares"]);
  const JsonAt changes = j["changes"];
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const JsonAt c = changes.at(i);
    BalanceChangeRecord r;
    r.step = c["step"].count();
    r.shares = shares_from_json(c["shares"]);
    const JsonAt times = c["seconds_per_sample"];
    for (std::size_t k = 0; k < times.size(); ++k) {
      r.seconds_per_sample.push_back(times.at(k).non_negative());
    }
    if (r.seconds_per_sample.size() != r.shares.size()) times.fail("needs one time per share");
    if (c.has("running")) {
      const JsonAt running = c["running"];
      for (std::size_t k = 0; k < running.size(); ++k) {
        r.running.push_back(running.at(k).non_negative());
        if (r.running.back() > 1) running.at(k).fail("is a fraction of the time, at most 1");
      }
      if (r.running.size() != r.shares.size()) running.fail("needs one fraction per share");
    } else {
      r.running.assign(r.shares.size(), 1.0);
    }
    r.predicted_before = c["predicted_before"].non_negative();
    r.predicted_after = c["predicted_after"].non_negative();
    if (c.has("step_seconds")) r.step_seconds = c["step_seconds"].non_negative();
    if (c.has("undo")) {
      r.undo = c["undo"].boolean();
      if (r.undo) r.before_move_seconds = c["before_move_seconds"].non_negative();
    }
    b.changes.push_back(r);
  }
  return b;
}

Json report_to_json(const RunSummary& s) {
  Json report;
  report["schema"] = std::string(kReportSchema);
  report["config"] = Json::parse(s.config_json);
  report["env"] = env_to_json(s.env);
  Json epochs = Json::array();
  for (const auto& e : s.epochs) epochs.push_back(epoch_to_json(e));
  report["epochs"] = epochs;
  report["total_seconds"] = s.total_seconds;
  report["images_per_s"] = s.images_per_s;
  Json ranks = Json::array();
  for (const auto& r : s.ranks) ranks.push_back(rank_to_json(r));
  report["ranks"] = ranks;
  // Only with compression, so that the reports of runs without it read as before.
  if (s.compression) report["compression"] = compression_to_json(*s.compression);
  report["straggler"] = straggler_to_json(s.straggler);
  if (s.balance) report["balance"] = balance_to_json(*s.balance);
  if (s.startup) {
    report["startup"] = {{"join_s", s.startup->join},
                         {"clocks_s", s.startup->clocks},
                         {"data_s", s.startup->data},
                         {"model_s", s.startup->model}};
  }
  if (!s.epochs.empty()) {
    report["final"] = {{"test_accuracy", s.epochs.back().test_accuracy},
                       {"test_loss", s.epochs.back().test_loss},
                       {"test_accuracy_top5", s.epochs.back().test_accuracy_top5}};
  } else {
    report["final"] = {
        {"test_accuracy", nullptr}, {"test_loss", nullptr}, {"test_accuracy_top5", nullptr}};
  }
  return report;
}

RunSummary report_from_json(const JsonAt& j) {
  if (!j.json().is_object()) j.fail("expected a JSON object, found " + JsonAt::type_of(j.json()));
  const std::string schema = j["schema"].string();
  if (schema != kReportSchema) {
    j["schema"].fail(detail::concat("is \"", schema, "\", expected \"", kReportSchema, "\""));
  }
  RunSummary s;
  s.config_json = j["config"].object().json().dump();
  s.env = env_from_json(j["env"]);
  const JsonAt epochs = j["epochs"];
  for (std::size_t i = 0; i < epochs.size(); ++i) s.epochs.push_back(epoch_from_json(epochs.at(i)));
  s.total_seconds = j["total_seconds"].non_negative();
  s.images_per_s = j["images_per_s"].non_negative();
  const JsonAt ranks = j["ranks"];
  for (std::size_t i = 0; i < ranks.size(); ++i) s.ranks.push_back(rank_from_json(ranks.at(i)));
  if (j.has("compression")) {
    s.compression = compression_from_json(j["compression"]);
  }
  if (j.has("straggler")) s.straggler = straggler_from_json(j["straggler"]);
  if (j.has("balance")) s.balance = balance_from_json(j["balance"]);
  if (j.has("startup")) {
    const JsonAt startup = j["startup"];
    s.startup = StartupRecord{startup["join_s"].non_negative(), startup["clocks_s"].non_negative(),
                              startup["data_s"].non_negative(), startup["model_s"].non_negative()};
  }
  j["final"].object();  // derived from the epochs, so only its presence is checked
  return s;
}

std::string os_name() {
#if defined(_WIN32)
  return "windows";
#elif defined(__APPLE__)
  return "macos";
#else
  return "linux";
#endif
}

}  // namespace partrain
