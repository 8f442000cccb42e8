// defines: RunReport and read_run_report() — a report.json read back, with the fields of its
// resolved config that parity compares by name. The format is report_format.h.
#pragma once

#include <map>
#include <string>

#include "trainer/report/report_format.h"

namespace partrain {

struct RunReport {
  std::string path;
  // As written; read_run_report() also makes sure that epochs, ranks and env.devices are not
  // empty and that every epoch took some time, which a comparison of runs needs.
  RunSummary summary;

  // From the resolved config: what the comparison needs by name...
  std::string strategy;  // single | ddp | dp
  int batch_size = 0;    // per rank
  int num_workers = 0;
  std::string dataset;
  int epochs_configured = 0;
  // ...and every scalar leaf, keyed by its dotted path ("data.num_workers" -> "2"), so that
  // two runs can be compared key by key without knowing every key.
  std::map<std::string, std::string> config_leaves;
};

// Reads a JSON file a person handed over (a report, a trace, a bench report). A file that
// cannot be opened or is not JSON is a UsageError naming it, `what` it was meant to be, and
// for JSON errors the byte offset, line and column.
nlohmann::ordered_json read_json_file(const std::string& path, const char* what);

// Reads and checks one report. Any unreadable, missing or ill-typed field is a UsageError
// naming the file and the JSON path ("runs/a/report.json: ranks[1].peak_rss_mb: ...").
RunReport read_run_report(const std::string& path);

}  // namespace partrain
