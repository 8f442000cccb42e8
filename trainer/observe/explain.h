// defines: explain_run() — what `partrain explain` prints for a report: a table of each rank's
// breakdown as shares of its training time, then a few sentences, each with the figure it
// rests on: where the time went, which rank (if any) the others waited for, and what would
// help. LibTorch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/observe/trace_format.h"
#include "trainer/report/report_reader.h"

namespace partrain {

// Shares from which a part is called out (of the mean rank's training time).
inline constexpr double kCommExposedNotable = 0.15;
inline constexpr double kDataWaitNotable = 0.10;
inline constexpr double kOptimizerNotable = 0.15;

// What `partrain bench allreduce --json` measured (its partrain.bench/1 file): the busbw of
// each backend and size, to hold the training's gradient allreduces against.
struct BenchFigure {
  std::string backend;
  std::int64_t bytes = 0;
  double busbw_gbps = 0;
};
struct BenchReport {
  std::string path;
  int world = 0;
  std::string wire_dtype;
  std::vector<BenchFigure> results;
};
// A missing or ill-typed field, or another schema, is a UsageError naming the file.
BenchReport read_bench_report(const std::string& path);

// The busbw a rank's gradient collectives achieved: the ring's 2(W-1)/W of the bytes it handed
// to them, over the time its communication thread spent in them; 0 without either.
double achieved_busbw_gbps(const RankRecord& rank, int world_size);

// trace: the run's trace summary, or null; bench: a bench allreduce report, or null. Throws
// UsageError naming the report when a rank has no breakdown (a report written before partrain
// recorded one).
std::string explain_run(const RunReport& report, const TraceSummary* trace,
                        const BenchReport* bench = nullptr);

}  // namespace partrain
