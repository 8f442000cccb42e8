// defines: RunSpec, run_summary(), report_json(), write_run_report(), kReference and
// source_dir() — report.json files with known figures, made by the real config loader and
// report writer, a reference file to hold them against, and where the tree's own files are,
// for the parity tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/scratch_dir.h"
#include "trainer/config/config.h"
#include "trainer/report/report_format.h"
#include "trainer/report/report_writer.h"

namespace partrain::testing {

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
  double final_accuracy = 0.3;  // the last epoch's test accuracy; the earlier ones have 0.2
};

// The run `spec` describes, as the trainer would report it. Its config is what load_config()
// makes of a config file with those settings (written to `dir`), so that every key a real
// report has is there.
inline RunSummary run_summary(const ScratchDir& dir, const RunSpec& spec) {
  const std::string yaml =
      "name: run_" + spec.strategy + "\nseed: 0\ndevice: " + spec.device +
      "\nstrategy: " + spec.strategy +
      "\nlaunch: {nproc_per_node: " + std::to_string(spec.strategy == "ddp" ? spec.world_size : 1) +
      "}\ncomm: {backend: " + (spec.strategy == "single" ? "auto" : "gloo") +
      "}\ndata: {dataset: " + spec.dataset + ", batch_size: " + std::to_string(spec.batch_size) +
      ", num_workers: " + std::to_string(spec.num_workers) +
      "}\nmodel: {name: digitalnet, width: 64}\ntrain: {epochs: " + std::to_string(spec.epochs) +
      ", optimizer: {lr: 0.05}}\noutput: {dir: runs/" + spec.strategy + "}\n";
  RunSummary run;
  run.config_json = config_to_json(load_config(dir.write("run_" + spec.strategy + ".yaml", yaml)));

  run.env.os = "linux";
  run.env.libtorch = "1.13.1";
  run.env.backend = spec.strategy == "ddp" ? "gloo" : "none";
  run.env.world_size = spec.world_size;
  run.env.strategy = spec.strategy;
  const int device_count = spec.strategy == "dp" ? 2 : spec.world_size;
  for (int i = 0; i < device_count; ++i) {
    run.env.devices.push_back(spec.device == "cpu" ? "cpu" : spec.device + ":" + std::to_string(i));
  }

  double total = 0.0;
  for (std::size_t i = 0; i < spec.epoch_seconds.size(); ++i) {
    EpochRecord epoch;
    epoch.epoch = static_cast<int>(i + 1);
    epoch.seconds = spec.epoch_seconds[i];
    epoch.train_seconds = spec.epoch_seconds[i];
    epoch.train_images_per_s = spec.images_per_s;
    epoch.images = static_cast<std::int64_t>(spec.images_per_s * spec.epoch_seconds[i]);
    epoch.steps = static_cast<std::int64_t>(i + 1) * 50;
    epoch.train_loss = 3.0;
    epoch.test_loss = 3.0;
    epoch.test_accuracy = i + 1 == spec.epoch_seconds.size() ? spec.final_accuracy : 0.2;
    run.epochs.push_back(epoch);
    total += spec.epoch_seconds[i];
  }
  run.total_seconds = total + 1.0;
  run.images_per_s = spec.images_per_s;

  for (std::size_t r = 0; r < spec.rss_mb.size(); ++r) {
    RankRecord rank;
    rank.rank = static_cast<int>(r);
    rank.device = spec.device == "cpu" ? "cpu" : spec.device + ":" + std::to_string(r);
    rank.peak_rss_mb = spec.rss_mb[r];
    if (spec.cuda_allocated_mb) rank.cuda_peak_allocated_mb = (*spec.cuda_allocated_mb)[r];
    if (spec.cuda_reserved_mb) rank.cuda_peak_reserved_mb = (*spec.cuda_reserved_mb)[r];
    rank.compute_seconds = 15.0;
    rank.comm_wait_seconds = 1.0;
    run.ranks.push_back(rank);
  }
  return run;
}

// The report as a document, for a test that changes it before writing it.
inline nlohmann::json report_json(const ScratchDir& dir, const RunSpec& spec) {
  return nlohmann::json(report_to_json(run_summary(dir, spec)));
}

// Writes the report through write_report() into the folder `name` of `dir` and returns the
// path of the report.json there.
inline std::string write_run_report(const ScratchDir& dir, const std::string& name,
                                    const RunSpec& spec) {
  const std::string folder = dir / name;
  write_report(folder, run_summary(dir, spec));
  return folder + "/report.json";
}

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

// The source tree (the reference files, checked-in reports): PARTRAIN_SOURCE_DIR when set,
// else the tree this test was built from.
inline std::string source_dir() {
  const char* dir = std::getenv("PARTRAIN_SOURCE_DIR");
  return dir ? dir : PARTRAIN_SOURCE_DIR_FALLBACK;
}

}  // namespace partrain::testing
