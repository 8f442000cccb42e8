// defines: `partrain worker CONFIG` — one rank. Who it is and where the ranks meet come from
// the environment of whatever started it: partrain run, torchrun, Slurm's srun or Open MPI's
// mpirun (the rules: cli/engine_env.h; for users: docs/clusters.md).
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/engine_env.h"
#include "common/errors.h"
#include "trainer/config/config.h"
#include "trainer/loop/worker.h"

namespace partrain::cli {
namespace {

WorkerEnv read_worker_env(const Config& config) {
  const EngineRank engine = read_engine_rank(process_environment(), config.launch.rendezvous);
  const WorkerEnv w = engine;
  PARTRAIN_CHECK(w.world_size == 1 || !w.rendezvous.empty(), UsageError, "no rendezvous for ",
                 w.world_size, " ranks started by ", engine_name(engine.engine),
                 ": set launch.rendezvous, MASTER_ADDR and MASTER_PORT, or PARTRAIN_RENDEZVOUS");
  return w;
}

}  // namespace

void add_worker_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand(
      "worker", "Run one rank (started by partrain run, torchrun, srun or mpirun)");
  auto args = std::make_shared<ConfigArguments>();
  add_config_arguments(*sub, *args);
  sub->callback([args, &exit_code] {
    Config config = load_config(args->path, args->overrides);
    exit_code = run_worker(config, read_worker_env(config));
  });
}

}  // namespace partrain::cli
