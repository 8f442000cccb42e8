// defines: MetricsLog — metrics.jsonl (a line per logged step and per epoch) and metrics.csv
// (a row per epoch), rank 0's record of a run as it trains. LibTorch-free.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "trainer/report/report_format.h"

namespace partrain {

// metrics.jsonl gets one line per logged step and per epoch, appended and flushed as they
// happen; metrics.csv (one row per epoch) is rewritten whole, atomically.
//
// `resumed` holds the epochs a resumed run already has (from its checkpoint), and
// `resumed_step` the optimizer steps it took. A fresh run (neither) starts both files anew, so
// an old run in the same folder never mixes in. A resumed run keeps metrics.jsonl's epoch
// lines up to its last resumed epoch and its step lines up to the resumed step, and drops the
// rest (what is trained again), and metrics.csv holds every epoch, as report.json does.
class MetricsLog {
 public:
  MetricsLog(const std::string& output_dir, const std::vector<EpochRecord>& resumed,
             std::int64_t resumed_step = 0);
  void log_step(int epoch, std::int64_t step, double loss, double images_per_s, double lr);
  // breakdown: each rank's (in rank order) over the epoch, from the end of the one before to
  // after this one's checkpoint; written as the line's "breakdown" array when not empty.
  void log_epoch(const EpochRecord& record, const std::vector<Breakdown>& breakdown = {});

 private:
  std::string dir_;
  std::ofstream jsonl_;
  std::vector<EpochRecord> epochs_;
};

}  // namespace partrain
