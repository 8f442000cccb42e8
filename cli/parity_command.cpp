// defines: `partrain parity REPORT... --reference FILE [--markdown FILE] [--svg FILE]`:
// holds a single-device run and its parallel twin against a reference experiment.
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/errors.h"
#include "trainer/parity/parity.h"

namespace partrain::cli {

void add_parity_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::vector<std::string> reports;
    std::string reference;
    std::string markdown;
    std::string svg;
  };
  auto options = std::make_shared<Options>();
  auto* sub = app.add_subcommand(
      "parity",
      "Compare a single-device run and a parallel run (report.json files) with a reference "
      "experiment: speed-up, throughput and memory per device, balance. Exit 0 when every "
      "checked figure is within the reference's tolerance, 1 when one is not.");
  sub->add_option("reports", options->reports,
                  "report.json of the single-device run and of the parallel run (and "
                  "optionally a DataParallel run)")
      ->required();
  sub->add_option("--reference", options->reference,
                  "reference file, e.g. configs/reference/seed_windows_gloo.yaml")
      ->required();
  sub->add_option("--markdown", options->markdown, "also write the Markdown table to FILE");
  sub->add_option("--svg", options->svg, "write the chart (SVG) to FILE");
  sub->callback([options, &exit_code] {
    const parity::ParityResult result = parity::compare(options->reports, options->reference);
    std::cout << parity::to_markdown(result) << std::flush;
    parity::write_parity_outputs(result, options->markdown, options->svg);
    exit_code = parity::exit_code(result);
  });
}

}  // namespace partrain::cli
