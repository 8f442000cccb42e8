// defines: WorkerEnv (who this process is in the run) and run_worker() — one rank's whole
// run: devices, rendezvous, data, model, the training loop, evaluation, report.
#pragma once

#include <string>

#include "common/rank_place.h"
#include "trainer/config/config.h"

namespace partrain {

// The rendezvous may be empty with world_size 1.
using WorkerEnv = RankPlace;

// Returns the exit code; throws UsageError (bad config or data) and Error (run failed). The
// config is taken as loaded: this rank resolves its batch size (resolve_batch_size()).
//
// A stop signal (common/stop_request.h) before the first step ends the process at once, exit
// kExitStopped, without running destructors or flushing: the caller makes stdout line-buffered
// first. After it, the ranks agree to stop at a step and save it.
int run_worker(Config config, const WorkerEnv& env);

}  // namespace partrain
