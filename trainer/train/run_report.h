// defines: EpochRecord, RankRecord, RunEnv, MetricsLog (metrics.jsonl + metrics.csv) and
// write_report() (report.json, DESIGN.md "Run report"). LibTorch-free.
#pragma once

#include <cstdint>
#include <fstream>
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
};

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
  std::string os;
  std::string libtorch;
  std::string backend;  // "none" for a single process
  int world_size = 1;
  std::string strategy;
  std::vector<std::string> devices;
  std::optional<std::string> cuda;
};

// metrics.jsonl gets one line per logged step and per epoch, appended and flushed as they
// happen; metrics.csv (one row per epoch) is rewritten whole, through a temp file.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& output_dir);
  void log_step(int epoch, std::int64_t step, double loss, double images_per_s, double lr);
  void log_epoch(const EpochRecord& record);

 private:
  std::string dir_;
  std::ofstream jsonl_;
  std::vector<EpochRecord> epochs_;
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

}  // namespace partrain
