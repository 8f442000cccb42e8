// defines: explain_run() — what `partrain explain` prints for a report: a table of each rank's
// breakdown as shares of its training time, then a few sentences, each with the figure it
// rests on: where the time went, which rank (if any) the others waited for, and what would
// help. LibTorch-free.
#pragma once

#include <string>

#include "trainer/observe/trace_format.h"
#include "trainer/report/report_reader.h"

namespace partrain {

// Shares from which a part is called out (of the mean rank's training time).
inline constexpr double kCommExposedNotable = 0.15;
inline constexpr double kDataWaitNotable = 0.10;
inline constexpr double kOptimizerNotable = 0.15;

// trace: the run's trace summary, or null. Throws UsageError naming the report when a rank
// has no breakdown (a report written before partrain recorded one).
std::string explain_run(const RunReport& report, const TraceSummary* trace);

}  // namespace partrain
