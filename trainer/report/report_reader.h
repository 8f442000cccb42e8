// defines: RunReport (the fields of a "partrain.report/1" report.json that parity reads) and
// read_run_report().
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace partrain::parity {

inline constexpr const char* kReportSchema = "partrain.report/1";

struct EpochFigures {
  double seconds = 0.0;
  double train_images_per_s = 0.0;
};

struct RankFigures {
  int rank = 0;
  double peak_rss_mb = 0.0;
  std::optional<double> cuda_peak_allocated_mb;  // absent on CPU (null in the report)
  std::optional<double> cuda_peak_reserved_mb;
  double compute_seconds = 0.0;
  double comm_wait_seconds = 0.0;
};

struct RunReport {
  std::string path;

  // From the resolved config: what the comparison needs by name...
  std::string strategy;  // single | ddp | dp
  int batch_size = 0;    // per rank
  int num_workers = 0;
  std::string dataset;
  int epochs_configured = 0;
  // ...and every scalar leaf, keyed by its dotted path ("data.num_workers" -> "2"), so that
  // two runs can be compared key by key without knowing every key.
  std::map<std::string, std::string> config_leaves;

  // env
  std::string os;
  std::string backend;
  int world_size = 0;
  std::string env_strategy;
  std::vector<std::string> devices;

  std::vector<EpochFigures> epochs;  // never empty
  double total_seconds = 0.0;
  double images_per_s = 0.0;
  std::vector<RankFigures> ranks;  // never empty
  std::optional<double> final_test_accuracy;
};

// Reads and checks one report. Any unreadable, missing or ill-typed field is a UsageError
// naming the file and the JSON path ("runs/a/report.json: ranks[1].peak_rss_mb: ...").
RunReport read_run_report(const std::string& path);

}  // namespace partrain::parity
