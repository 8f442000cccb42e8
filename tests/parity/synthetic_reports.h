// defines: RunSpec, report_json() and TempDir — synthetic report.json files and reference
// files with known figures, for the parity tests.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace partrain::parity::testing {

struct RunSpec {
  std::string strategy = "single";
  int world_size = 1;
  int batch_size = 1000;
  int num_workers = 0;
  int epochs = 10;
  std::string dataset = "cifar100";
  std::string device = "cpu";
  std::vector<double> epoch_seconds = {10.0, 10.0};
  double images_per_s = 5000.0;
  std::vector<double> rss_mb = {500.0};
  std::optional<std::vector<double>> cuda_allocated_mb;
  std::optional<std::vector<double>> cuda_reserved_mb;
  double final_accuracy = 0.3;
};

inline nlohmann::json report_json(const RunSpec& spec) {
  using nlohmann::json;
  json config = {{"name", "run_" + spec.strategy},
                 {"seed", 0},
                 {"device", spec.device},
                 {"strategy", spec.strategy},
                 {"launch", {{"nproc_per_node", spec.world_size}, {"nnodes", 1}}},
                 {"comm", {{"backend", spec.strategy == "single" ? "auto" : "gloo"}}},
                 {"data",
                  {{"dataset", spec.dataset},
                   {"batch_size", spec.batch_size},
                   {"num_workers", spec.num_workers},
                   {"train_limit", 0}}},
                 {"model", {{"name", "digitalnet"}, {"width", 64}}},
                 {"train", {{"epochs", spec.epochs}, {"optimizer", {{"lr", 0.05}}}}},
                 {"output", {{"dir", "runs/" + spec.strategy}}}};
  json devices = json::array();
  const int device_count = spec.strategy == "dp" ? 2 : spec.world_size;
  for (int i = 0; i < device_count; ++i) {
    devices.push_back(spec.device == "cpu" ? "cpu" : spec.device + ":" + std::to_string(i));
  }
  json epochs = json::array();
  for (std::size_t i = 0; i < spec.epoch_seconds.size(); ++i) {
    epochs.push_back({{"epoch", i + 1},
                      {"seconds", spec.epoch_seconds[i]},
                      {"train_images_per_s", spec.images_per_s},
                      {"train_loss", 3.0},
                      {"test_loss", 3.0},
                      {"test_accuracy", 0.2}});
  }
  json ranks = json::array();
  for (std::size_t r = 0; r < spec.rss_mb.size(); ++r) {
    json rank = {{"rank", r},
                 {"peak_rss_mb", spec.rss_mb[r]},
                 {"cuda_peak_allocated_mb", nullptr},
                 {"cuda_peak_reserved_mb", nullptr},
                 {"compute_seconds", 15.0},
                 {"comm_wait_seconds", 1.0}};
    if (spec.cuda_allocated_mb) rank["cuda_peak_allocated_mb"] = (*spec.cuda_allocated_mb)[r];
    if (spec.cuda_reserved_mb) rank["cuda_peak_reserved_mb"] = (*spec.cuda_reserved_mb)[r];
    ranks.push_back(rank);
  }
  double total = 0.0;
  for (double s : spec.epoch_seconds) total += s;
  return {{"schema", "partrain.report/1"},
          {"config", config},
          {"env",
           {{"os", "linux"},
            {"libtorch", "1.13.1"},
            {"backend", spec.strategy == "ddp" ? "gloo" : "none"},
            {"world_size", spec.world_size},
            {"strategy", spec.strategy},
            {"devices", devices},
            {"cuda", nullptr}}},
          {"epochs", epochs},
          {"total_seconds", total + 1.0},
          {"images_per_s", spec.images_per_s},
          {"ranks", ranks},
          {"final", {{"test_accuracy", spec.final_accuracy}, {"test_loss", 2.9}}}};
}

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "parity_test_XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = (path_ / name).string();
    std::ofstream(file, std::ios::binary) << text;
    return file;
  }
  std::string write_report(const std::string& name, const RunSpec& spec) const {
    return write(name, report_json(spec).dump(2));
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A ddp twin of the default single run: 2 ranks x half the batch.
inline RunSpec ddp_spec() {
  RunSpec spec;
  spec.strategy = "ddp";
  spec.world_size = 2;
  spec.batch_size = 500;
  spec.rss_mb = {400.0, 380.0};
  return spec;
}

// Reference figures: speed-up 100/50 = 2, memory per device 800/1000 and 600/1000,
// balance 600/800 = 0.75.
inline const char* kReference = R"(name: test-reference
os: linux
backend: gloo
dataset: cifar100
model: digitalnet
epochs: 10
train_images: 50000
single:   {devices: 1, batch_size: 1000, num_workers: 0, seconds: 100, gpu_memory_mb: [1000]}
parallel: {strategy: ddp, devices: 2, batch_size_per_rank: 500, num_workers: 0,
           seconds: 50, gpu_memory_mb: [800, 600]}
tolerance:
  speedup: {min: 0.85}
  memory_ratio: {max: 1.25}
  balance: {min: 0.95}
)";

}  // namespace partrain::parity::testing
