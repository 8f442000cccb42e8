// defines: Reference (one measured single-device run and one data-parallel run to hold ours
// against, with the tolerance bands) and load_reference().
//
// The file format is described in docs/parity.md; configs/reference/ holds the experiment's
// figures.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace partrain::parity {

struct ReferenceRun {
  std::string strategy;  // single | ddp | dp
  int devices = 1;
  std::optional<int> batch_size;  // per device (per rank for ddp)
  std::optional<int> num_workers;
  std::optional<double> seconds;  // the whole run, all epochs
  std::vector<double> memory_mb;  // per device, as the experiment measured it
};

// A band on ours / reference: within when min <= ratio <= max (either end may be open).
struct Tolerance {
  std::optional<double> min;
  std::optional<double> max;
};

// The figures a tolerance may name (keys of the `tolerance:` section).
inline constexpr const char* kSpeedup = "speedup";
inline constexpr const char* kEfficiency = "efficiency";
inline constexpr const char* kMemoryRatio = "memory_ratio";
inline constexpr const char* kBalance = "balance";

struct Reference {
  std::string path;
  std::string name;
  std::string os;
  std::string backend;
  std::string dataset;
  std::string model;
  std::string note;
  std::optional<int> epochs;
  std::optional<long long> train_images;  // training images per epoch
  std::string memory_source;              // how memory_mb was measured, e.g. "nvidia-smi"
  ReferenceRun single;
  ReferenceRun parallel;

  // Derived figures: from the raw figures when the file has them (and then any `derived:`
  // value must agree with them), else as the file states them.
  std::optional<double> speedup;     // single seconds / parallel seconds
  std::vector<double> memory_ratio;  // parallel memory per device / single memory
  std::optional<double> balance;     // min / max of parallel memory per device

  std::map<std::string, Tolerance> tolerance;  // keyed by kSpeedup, kEfficiency, ...
};

// Reads and checks a reference file; every error is a UsageError "FILE:LINE:COL: key: what".
Reference load_reference(const std::string& path);

}  // namespace partrain::parity
