// defines: `partrain worker CONFIG` — one rank. Who it is and where the ranks meet come from
// the environment of whatever started it: partrain run, torchrun, Slurm's srun or Open MPI's
// mpirun (the rules: cli/engine_env.h; for users: docs/clusters.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/engine_env.h"
#include "common/errors.h"
#include "common/heartbeat.h"
#include "common/output_lock.h"
#include "trainer/config/config.h"
#include "trainer/config/config_agreement.h"
#include "trainer/loop/worker.h"

namespace partrain::cli {
namespace {

// Started by torchrun, srun or mpirun (no partrain run, which holds the lock itself): the
// first rank of each node takes OUTPUT/partrain.lock for the run, under the token that the
// run's every start shares (engine_env.h), so that a restart or a re-formed world is the
// same run.
std::unique_ptr<OutputLock> lock_output_for_engine(const Config& config, const EngineRank& engine) {
  if (engine.engine == Engine::partrain || engine.local_rank != 0) return nullptr;
  return std::make_unique<OutputLock>(
      config.output_dir, engine.lock_token,
      [](const std::string& line) { std::fprintf(stderr, "partrain: %s\n", line.c_str()); });
}

WorkerEnv read_worker_env(const EngineRank& engine) {
  const WorkerEnv w = engine;
  PARTRAIN_CHECK(w.world_size == 1 || !w.rendezvous.empty(), UsageError, "no rendezvous for ",
                 w.world_size, " ranks started by ", engine_name(engine.engine),
                 ": set launch.rendezvous, MASTER_ADDR and MASTER_PORT, or PARTRAIN_RENDEZVOUS");
  return w;
}

// This rank stopped before it met the others (its config, its place in the run, its output
// folder): where the environment says who it is and where the ranks meet (a config it could not
// read names neither its rendezvous nor its timeout: the environment's and the default then),
// the others learn why at once instead of at their timeout (config_agreement.h).
void tell_others_this_rank_stopped(const EnvLookup& env, const Config& config,
                                   const std::string& why) {
  try {
    const EngineRank engine = read_engine_rank(env, config.launch.rendezvous);
    if (engine.engine == Engine::none) return;
    tell_ranks_this_one_stopped(engine, why, config.comm.timeout());
  } catch (const Error&) {
    // Its place unreadable: nobody to tell.
  }
}

// PARTRAIN_HEARTBEAT_S, when the launcher set it to a positive number of seconds.
std::optional<double> heartbeat_interval(const EnvLookup& env) {
  const std::optional<std::string> text = env("PARTRAIN_HEARTBEAT_S");
  if (!text) return std::nullopt;
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  PARTRAIN_CHECK(end != text->c_str() && *end == '\0' && seconds > 0 && seconds <= 3600, UsageError,
                 "PARTRAIN_HEARTBEAT_S='", *text, "': expected seconds in (0, 3600]");
  return seconds;
}

}  // namespace

void line_buffer_stdout() {
#ifdef _WIN32
  std::setvbuf(stdout, nullptr, _IONBF, 0);
#else
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
#endif
}

void add_worker_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand(
      "worker", "Run one rank (started by partrain run, torchrun, srun or mpirun)");
  auto args = std::make_shared<ConfigArguments>();
  add_config_arguments(*sub, *args);
  sub->callback([args, &exit_code] {
    line_buffer_stdout();
    // Started by `partrain run`: the launcher watches for this worker's heartbeat.
    std::unique_ptr<Heartbeat> heartbeat;
    const std::optional<double> interval = heartbeat_interval(process_environment());
    if (interval) heartbeat = std::make_unique<Heartbeat>(*interval);
    const EnvLookup env = process_environment();
    Config config;
    EngineRank engine;
    std::unique_ptr<OutputLock> lock;
    try {
      config = load_config(args->path, args->overrides);
      engine = read_engine_rank(env, config.launch.rendezvous);
      lock = lock_output_for_engine(config, engine);
    } catch (const std::exception& e) {
      tell_others_this_rank_stopped(env, config, e.what());
      throw;
    }
    // An engine may start the run again in another world (torchrun elastic, a requeue): the
    // log says which world each start had.
    if (engine.rank == 0 && engine.engine != Engine::partrain && engine.engine != Engine::none) {
      std::printf("partrain worker: a world of %d rank%s, started by %s (restart %d)\n",
                  engine.world_size, engine.world_size == 1 ? "" : "s",
                  engine_name(engine.engine).c_str(), engine.restart);
      std::fflush(stdout);
    }
    exit_code = run_worker(config, read_worker_env(engine));
  });
}

}  // namespace partrain::cli
