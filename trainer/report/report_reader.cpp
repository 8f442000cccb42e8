#include "trainer/report/report_reader.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

// Scalars as text keyed by dotted path; arrays count as one leaf (their JSON text).
void flatten(const Json& value, const std::string& prefix,
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

nlohmann::ordered_json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  PARTRAIN_CHECK(in, UsageError, path, ": cannot open ", what);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::parse_error& e) {
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
}

RunReport read_run_report(const std::string& path) {
  const Json doc = read_json_file(path, "the report");
  const JsonAt root(doc, path);
  RunReport report;
  report.path = path;
  report.summary = report_from_json(root);

  const JsonAt config = root["config"];
  report.strategy = config["strategy"].string();
  const JsonAt data = config["data"];
  report.batch_size = data["batch_size"].integer();
  report.num_workers = data["num_workers"].integer();
  report.dataset = data["dataset"].string();
  report.epochs_configured = config["train"]["epochs"].integer();
  if (report.batch_size <= 0) data["batch_size"].fail("must be positive");
  flatten(config.json(), "", report.config_leaves);

  // What the format allows but a comparison of runs cannot use.
  const RunSummary& s = report.summary;
  if (s.env.devices.empty()) root["env"]["devices"].fail("is empty");
  if (s.epochs.empty()) root["epochs"].fail("is empty: the run finished no epoch");
  for (std::size_t i = 0; i < s.epochs.size(); ++i) {
    if (s.epochs[i].seconds <= 0.0) root["epochs"].at(i)["seconds"].fail("must be positive");
  }
  if (s.ranks.empty()) root["ranks"].fail("is empty");
  return report;
}

}  // namespace partrain
