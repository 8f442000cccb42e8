// defines: gather_and_write_report() — the end of a run: every rank's figures (memory,
// compute and communication time, device, breakdown) gathered to rank 0, which writes
// report.json with the run's straggler verdict and, in global-batch mode, its split (balance).
#pragma once

#include <c10/core/Device.h>

#include <optional>
#include <vector>

#include "common/stopwatch.h"
#include "trainer/config/config.h"
#include "trainer/report/report_writer.h"
#include "trainer/parallel/strategy.h"
#include "trainer/loop/observer.h"
#include "trainer/loop/worker.h"

namespace partrain {

// Every rank calls it (the figures travel by allgather). Rank 0 writes OUTPUT/report.json
// and prints where it is.
void gather_and_write_report(const Config& config, const WorkerEnv& env, const c10::Device& device,
                             Strategy& strategy, double compute_seconds,
                             const std::vector<EpochRecord>& epochs, Clock::time_point run_start,
                             const RunObserver& observer,
                             const std::optional<BalanceRecord>& balance = std::nullopt);

}  // namespace partrain
