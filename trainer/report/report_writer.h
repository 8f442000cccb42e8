// defines: write_report() — report.json in the run's output folder, written atomically. The
// format itself (records, field names, schema) is report_format.h; the reading side is
// report_reader.h; metrics.jsonl and metrics.csv are metrics_log.h. LibTorch-free.
#pragma once

#include <string>

#include "trainer/report/report_format.h"

namespace partrain {

// OUTPUT_DIR/report.json: report_to_json(summary), indented by 2, with a final newline.
void write_report(const std::string& output_dir, const RunSummary& summary);

}  // namespace partrain
