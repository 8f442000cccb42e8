// defines: the parity comparison of our runs against a reference experiment — compare(),
// ParityResult and its parts, to_markdown(), to_svg(), exit_code(), write_parity_outputs().
//
// Absolute times do not carry across hardware; ratios do. So compare() reduces each pair of
// runs (one single-device run, one parallel run) to ratios — speed-up at equal total batch,
// throughput per device relative to the single run, memory per device relative to the single
// run, balance (min/max) across devices — and holds each against the reference's same ratio:
// ours / reference, within or outside the band the reference file sets. docs/parity.md says
// what every number means.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trainer/parity/reference.h"
#include "trainer/report/report_reader.h"

namespace partrain::parity {

enum class Verdict {
  kInfo,     // shown for context, no tolerance applies
  kWithin,   // ours / reference inside the band (edges included)
  kOutside,  // ours / reference outside the band
};

struct Figure {
  std::string id;     // the tolerance key it is checked against (kSpeedup, ...); "" for none
  std::string label;  // what a reader sees: "Speed-up at equal total batch"
  std::string unit;   // "s", "img/s", "x" or "" for a plain ratio
  std::optional<double> ours;
  std::optional<double> reference;
  std::optional<double> ratio;  // ours / reference, when both exist
  std::optional<Tolerance> tolerance;
  Verdict verdict = Verdict::kInfo;
};

// One of our runs as the comparison sees it.
struct RunSummary {
  std::string role;  // single | ddp | dp
  std::string path;
  int devices = 1;
  std::string device_kind;  // "cpu", "cuda", ... (devices[0] up to ':')
  std::string backend;
  int batch_size_per_rank = 0;
  int total_batch = 0;
  int num_workers = 0;
  int epochs_run = 0;
  double mean_epoch_seconds = 0.0;
  double images_per_s = 0.0;
  std::vector<double> memory_mb;  // per rank, from memory_source
  std::string memory_source;      // peak_rss_mb | cuda_peak_reserved_mb | cuda_peak_allocated_mb
  std::optional<double> final_test_accuracy;
};

struct ParityResult {
  Reference reference;
  RunSummary single;
  RunSummary parallel;              // the run of the reference's parallel strategy
  std::optional<RunSummary> extra;  // a further parallel run (dp beside ddp), no reference
  std::vector<Figure> figures;
  std::vector<std::string> warnings;  // the comparison may be unfair: read before trusting it
  std::vector<std::string> notes;     // how the numbers were measured
};

// Reads the reports (one single-device run, one run of the reference's parallel strategy,
// optionally one more parallel run) and the reference file, and compares them. Unreadable or
// unsuitable input is a UsageError naming the file (and JSON path or line:col).
ParityResult compare(const std::vector<std::string>& report_paths,
                     const std::string& reference_path);

// 0 when every checked figure is within tolerance, 1 when one is outside.
int exit_code(const ParityResult& result);

std::string to_markdown(const ParityResult& result);
std::string to_svg(const ParityResult& result);

// Writes the Markdown and/or the SVG (an empty path skips it), each to a temporary name
// renamed into place, so a reader never sees half a file. A failure is a UsageError.
void write_parity_outputs(const ParityResult& result, const std::string& markdown_path,
                          const std::string& svg_path);

}  // namespace partrain::parity
