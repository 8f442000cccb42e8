// defines: EpochRecord (and its JSON form, shared by the report, metrics.jsonl and the
// checkpoints), RankRecord, RunEnv, RunSummary and write_report() (report.json), os_name().
// LibTorch-free. The reading side of report.json is report_reader.h; metrics.jsonl and
// metrics.csv are metrics_log.h.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace partrain {

struct EpochRecord {
  int epoch = 0;
  double seconds = 0;        // wall time of the epoch: training plus evaluation
  double train_seconds = 0;  // training part only; images/s is measured on it
  double train_images_per_s = 0;
  std::int64_t images = 0;  // training images, all ranks
  std::int64_t steps = 0;   // optimizer steps taken so far
  double train_loss = 0;
  double test_loss = 0;
  double test_accuracy = 0;
  double test_accuracy_top5 = 0;
  std::int64_t skipped_steps = 0;  // f16: steps so far skipped for gradients that overflowed
};

// The epoch's entry of report.json's "epochs", of the checkpoint's metadata and of an epoch
// line of metrics.jsonl; epoch_from_json() throws nlohmann's exceptions on a missing field.
nlohmann::ordered_json epoch_to_json(const EpochRecord& record);
EpochRecord epoch_from_json(const nlohmann::json& j);

struct RankRecord {
  int rank = 0;
  std::string device;
  double peak_rss_mb = 0;
  std::optional<double> cuda_peak_allocated_mb;
  std::optional<double> cuda_peak_reserved_mb;
  std::optional<double> cuda_driver_used_mb;  // what the driver reports for the device
  double compute_seconds = 0;
  double comm_wait_seconds = 0;
  double comm_busy_seconds = 0;
};

struct RunEnv {
  std::string libtorch;
  std::string backend;  // "none" for a single process
  int world_size = 1;
  std::string strategy;
  std::vector<std::string> devices;
  std::optional<std::string> cuda;
};

struct RunSummary {
  std::string config_json;
  RunEnv env;
  std::vector<EpochRecord> epochs;
  double total_seconds = 0;
  double images_per_s = 0;
  std::vector<RankRecord> ranks;
};

void write_report(const std::string& output_dir, const RunSummary& summary);

std::string os_name();  // "linux", "windows", "macos": what this binary was built for

}  // namespace partrain
