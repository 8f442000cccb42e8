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
// A stop signal (common/stop_request.h) before the first step ends a process that is the
// rank's alone (`own_process`, a worker) at once, exit kExitStopped; after it, the ranks agree
// to stop at a step and save it. `partrain run` training one rank in its own process answers
// every stop at a step: its stdout is not made line-buffered, so an end that flushes nothing
// could lose lines it printed.
int run_worker(Config config, const WorkerEnv& env, bool own_process = true);

}  // namespace partrain
