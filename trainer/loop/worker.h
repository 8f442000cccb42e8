// defines: WorkerEnv (who this process is in the run) and run_worker() — one rank's whole
// run: devices, rendezvous, data, model, the training loop, evaluation, report.
#pragma once

#include <string>

#include "trainer/config/config.h"

namespace partrain {

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string rendezvous;  // store url; empty with world_size 1
  std::string token;       // run token shared by every rank
  int restart = 0;         // how many times the launcher restarted the group
};

// Returns the exit code; throws UsageError (bad config or data) and Error (run failed).
int run_worker(const Config& config, const WorkerEnv& env);

}  // namespace partrain
