#include "trainer/report/report_reader.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"

namespace partrain::parity {
namespace {

using nlohmann::json;

// Reads fields of one parsed report; every error names the file and the JSON path of the
// field ("epochs[2].seconds"), because a report is written by another program and the user
// has to find what that program got wrong.
class ReportFields {
 public:
  explicit ReportFields(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw UsageError(
        detail::concat(path_, ": ", where.empty() ? "(top level)" : where, ": ", what));
  }

  const json& member(const json& object, const std::string& where, const char* key) const {
    if (!object.is_object()) fail(where, "expected an object, found " + type_of(object));
    auto it = object.find(key);
    if (it == object.end()) fail(child_path(where, key), "missing");
    return *it;
  }

  std::string child_path(const std::string& where, const char* key) const {
    return where.empty() ? key : where + "." + key;
  }

  double number(const json& object, const std::string& where, const char* key) const {
    const json& value = member(object, where, key);
    if (!value.is_number())
      fail(child_path(where, key), "expected a number, found " + type_of(value));
    return value.get<double>();
  }

  double non_negative(const json& object, const std::string& where, const char* key) const {
    const double value = number(object, where, key);
    if (!(value >= 0.0)) fail(child_path(where, key), "must not be negative");
    return value;
  }

  std::optional<double> number_or_null(const json& object, const std::string& where,
                                       const char* key) const {
    const json& value = member(object, where, key);
    if (value.is_null()) return std::nullopt;
    if (!value.is_number()) {
      fail(child_path(where, key), "expected a number or null, found " + type_of(value));
    }
    return value.get<double>();
  }

  int integer(const json& object, const std::string& where, const char* key) const {
    const json& value = member(object, where, key);
    if (!value.is_number_integer()) {
      fail(child_path(where, key), "expected an integer, found " + type_of(value));
    }
    return value.get<int>();
  }

  std::string string(const json& object, const std::string& where, const char* key) const {
    const json& value = member(object, where, key);
    if (!value.is_string())
      fail(child_path(where, key), "expected a string, found " + type_of(value));
    return value.get<std::string>();
  }

  const json& array(const json& object, const std::string& where, const char* key) const {
    const json& value = member(object, where, key);
    if (!value.is_array())
      fail(child_path(where, key), "expected an array, found " + type_of(value));
    return value;
  }

  static std::string type_of(const json& value) {
    if (value.is_number_integer()) return "an integer";
    if (value.is_number()) return "a number";
    if (value.is_null()) return "null";
    return std::string(value.is_array() || value.is_object() ? "an " : "a ") + value.type_name();
  }

 private:
  std::string path_;
};

// Scalars as text keyed by dotted path; arrays count as one leaf (their JSON text).
void flatten(const json& value, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (value.is_object()) {
    for (const auto& [key, child] : value.items()) {
      flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else if (value.is_string()) {
    out[prefix] = value.get<std::string>();
  } else {
    out[prefix] = value.dump();
  }
}

}  // namespace

RunReport read_run_report(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PARTRAIN_CHECK(in, UsageError, path, ": cannot open the report");
  std::stringstream text;
  text << in.rdbuf();

  json doc;
  try {
    doc = json::parse(text.str());
  } catch (const json::parse_error& e) {
    // nlohmann says "[json.exception.parse_error.101] parse error at line L, column C: why";
    // keep the position and the why. Its byte counts from 1; an offset counts from 0.
    std::string reason = e.what();
    std::string position;
    const std::string marker = "parse error at ";
    if (auto at = reason.find(marker); at != std::string::npos) {
      if (auto colon = reason.find(": ", at); colon != std::string::npos) {
        position = " (" + reason.substr(at + marker.size(), colon - at - marker.size()) + ")";
        reason = reason.substr(colon + 2);
      }
    }
    throw UsageError(detail::concat(path, ": not valid JSON at byte offset ",
                                    e.byte > 0 ? e.byte - 1 : 0, position, ": ", reason));
  }

  ReportFields f(path);
  RunReport report;
  report.path = path;
  if (!doc.is_object()) f.fail("", "expected a JSON object, found " + ReportFields::type_of(doc));
  const std::string schema = f.string(doc, "", "schema");
  if (schema != kReportSchema) {
    f.fail("schema", "is \"" + schema + "\", expected \"" + kReportSchema + "\"");
  }

  const json& config = f.member(doc, "", "config");
  report.strategy = f.string(config, "config", "strategy");
  const json& data = f.member(config, "config", "data");
  report.batch_size = f.integer(data, "config.data", "batch_size");
  report.num_workers = f.integer(data, "config.data", "num_workers");
  report.dataset = f.string(data, "config.data", "dataset");
  const json& train = f.member(config, "config", "train");
  report.epochs_configured = f.integer(train, "config.train", "epochs");
  if (report.batch_size <= 0) f.fail("config.data.batch_size", "must be positive");
  flatten(config, "", report.config_leaves);

  const json& env = f.member(doc, "", "env");
  report.os = f.string(env, "env", "os");
  report.backend = f.string(env, "env", "backend");
  report.world_size = f.integer(env, "env", "world_size");
  report.env_strategy = f.string(env, "env", "strategy");
  if (report.world_size < 1) f.fail("env.world_size", "must be at least 1");
  const json& devices = f.array(env, "env", "devices");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (!devices[i].is_string()) {
      f.fail("env.devices[" + std::to_string(i) + "]",
             "expected a string, found " + ReportFields::type_of(devices[i]));
    }
    report.devices.push_back(devices[i].get<std::string>());
  }
  if (report.devices.empty()) f.fail("env.devices", "is empty");

  const json& epochs = f.array(doc, "", "epochs");
  if (epochs.empty()) f.fail("epochs", "is empty: the run finished no epoch");
  for (std::size_t i = 0; i < epochs.size(); ++i) {
    const std::string where = "epochs[" + std::to_string(i) + "]";
    EpochFigures epoch;
    epoch.seconds = f.non_negative(epochs[i], where, "seconds");
    epoch.train_images_per_s = f.non_negative(epochs[i], where, "train_images_per_s");
    if (epoch.seconds <= 0.0) f.fail(where + ".seconds", "must be positive");
    report.epochs.push_back(epoch);
  }
  report.total_seconds = f.non_negative(doc, "", "total_seconds");
  report.images_per_s = f.non_negative(doc, "", "images_per_s");

  const json& ranks = f.array(doc, "", "ranks");
  if (ranks.empty()) f.fail("ranks", "is empty");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string where = "ranks[" + std::to_string(i) + "]";
    RankFigures rank;
    rank.rank = f.integer(ranks[i], where, "rank");
    rank.peak_rss_mb = f.non_negative(ranks[i], where, "peak_rss_mb");
    rank.cuda_peak_allocated_mb = f.number_or_null(ranks[i], where, "cuda_peak_allocated_mb");
    rank.cuda_peak_reserved_mb = f.number_or_null(ranks[i], where, "cuda_peak_reserved_mb");
    rank.compute_seconds = f.non_negative(ranks[i], where, "compute_seconds");
    rank.comm_wait_seconds = f.non_negative(ranks[i], where, "comm_wait_seconds");
    report.ranks.push_back(rank);
  }

  const json& final_figures = f.member(doc, "", "final");
  if (!final_figures.is_object()) {
    f.fail("final", "expected an object, found " + ReportFields::type_of(final_figures));
  }
  if (auto it = final_figures.find("test_accuracy"); it != final_figures.end() && it->is_number()) {
    report.final_test_accuracy = it->get<double>();
  }
  return report;
}

}  // namespace partrain::parity
