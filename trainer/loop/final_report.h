// defines: gather_and_write_report() — the end of a run: every rank's figures (memory,
// compute and communication time, device, breakdown) gathered to rank 0, which writes
// report.json with the run's straggler verdict and, in global-batch mode, its split (balance).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "common/stopwatch.h"
#include "trainer/config/config.h"
#include "trainer/report/report_writer.h"
#include "trainer/parallel/strategy.h"
#include "trainer/loop/observer.h"
#include "trainer/loop/worker.h"

namespace partrain {

// What this rank measured of its memory (trainer/report/report_format.h, MemoryBreakdown): its
// resident memory before the run made anything and what loading the data added, the step peak
// (TrainStep::step_peak_bytes) and what its strategy holds. CPU runs only: on CUDA the tensors
// live in the device's memory, which the CUDA fields of the report describe.
struct RankMemory {
  double floor_mb = 0;
  double data_mb = 0;
  std::int64_t step_peak_bytes = 0;
  StrategyMemory held;
};

// Every rank calls it (the figures travel by allgather). Rank 0 writes OUTPUT/report.json
// and prints where it is.
void gather_and_write_report(const Config& config, const WorkerEnv& env, const c10::Device& device,
                             Strategy& strategy, double compute_seconds,
                             const std::vector<EpochRecord>& epochs, Clock::time_point run_start,
                             const RunObserver& observer,
                             const std::optional<BalanceRecord>& balance = std::nullopt,
                             const std::optional<RankMemory>& memory = std::nullopt);

}  // namespace partrain
