// defines: `partrain explain REPORT [--trace TRACE] [--bench BENCH] [--baseline REPORT]
// [--probe REPORT] [--json]`: where a run's time went (each rank's breakdown), who the others
// waited for, how fast the gradients travelled (against a `partrain bench allreduce --json`
// report), the speed-up over the single-device run decomposed, and what would help — read from its
// report.json (and trace.json), each claim with the figure it rests on; `partrain explain OUTPUT`
// of a failed run: where each rank stood among its last collectives (OUTPUT/flight). Bad input:
// exit 2, one line.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/errors.h"
#include "trainer/observe/explain.h"
#include "trainer/observe/flight_recorder.h"
#include "trainer/observe/trace_format.h"
#include "trainer/report/report_reader.h"

namespace partrain::cli {

void add_explain_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string report;
    std::string trace;
    std::string bench;
    std::string baseline;
    std::string probe;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  auto* sub = app.add_subcommand(
      "explain",
      "Explain a run from its report.json: each rank's time by part (data wait, forward, "
      "backward, exposed communication, optimizer, evaluation, checkpoint, other), the "
      "straggler if any, and what would help");
  sub->add_option("report", options->report,
                  "report.json of the run, or the flight records of a failed one (OUTPUT or "
                  "OUTPUT/flight)")
      ->required();
  sub->add_option("--trace", options->trace, "the run's trace.json (partrain run --trace)");
  sub->add_option("--bench", options->bench,
                  "a partrain bench allreduce --json report of the same hosts, to hold the "
                  "gradients' busbw against");
  sub->add_option("--baseline", options->baseline,
                  "report.json of the single-device run of the same config, to decompose the "
                  "speed-up (default: baseline/report.json beside REPORT, as --with-baseline "
                  "leaves it, when there is one)");
  sub->add_option("--probe", options->probe,
                  "report.json of one process at one rank's batch and threads (default: "
                  "baseline-rank-batch/report.json beside REPORT, as --with-baseline leaves it): "
                  "splits slower compute into the smaller batch and the ranks' contention");
  sub->add_flag("--json", options->json,
                "print one JSON object (partrain.explain/1) instead of sentences");
  sub->callback([options, &exit_code] {
    // A failed run has no report: its flight records say where each rank stood.
    std::error_code ec;
    if (std::filesystem::is_directory(options->report, ec)) {
      const std::filesystem::path flight = std::filesystem::path(options->report) / "flight";
      std::cout << explain_flight(std::filesystem::is_directory(flight, ec) ? flight.string()
                                                                            : options->report)
                << std::flush;
      exit_code = 0;
      return;
    }
    const RunReport report = read_run_report(options->report);
    TraceSummary trace;
    if (!options->trace.empty()) trace = read_trace_summary(options->trace);
    BenchReport bench;
    if (!options->bench.empty()) bench = read_bench_report(options->bench);
    // A report of the folder REPORT is in, as `partrain run --with-baseline` leaves them.
    auto beside = [&](const std::string& given, const char* folder) {
      if (!given.empty()) return given;
      const std::filesystem::path path =
          std::filesystem::path(options->report).parent_path() / folder / "report.json";
      return std::filesystem::is_regular_file(path, ec) ? path.string() : std::string();
    };
    const std::string baseline_path = beside(options->baseline, "baseline");
    // The probe only splits the baseline's compute part.
    PARTRAIN_CHECK(options->probe.empty() || !baseline_path.empty(), UsageError,
                   "--probe splits the compute part of the speed-up over a baseline, but ",
                   options->report, " has none beside it: give --baseline too");
    const std::string probe_path =
        baseline_path.empty() ? std::string() : beside(options->probe, "baseline-rank-batch");
    RunReport baseline, probe;
    if (!baseline_path.empty()) baseline = read_run_report(baseline_path);
    if (!probe_path.empty()) probe = read_run_report(probe_path);
    const Explanation ex =
        explain(report, options->trace.empty() ? nullptr : &trace,
                options->bench.empty() ? nullptr : &bench,
                baseline_path.empty() ? nullptr : &baseline, probe_path.empty() ? nullptr : &probe);
    if (options->json) {
      std::cout << explanation_to_json(ex, report).dump(2) << "\n" << std::flush;
    } else {
      std::cout << ex.text << std::flush;
    }
    exit_code = 0;
  });
}

}  // namespace partrain::cli
