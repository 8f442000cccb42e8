// defines: `partrain worker CONFIG` — one rank. Who it is comes from the environment of
// whatever started it: partrain run and torchrun (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID) or Open MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
// _LOCAL_SIZE). The rendezvous is PARTRAIN_RENDEZVOUS, else launch.rendezvous, else env://
// when MASTER_ADDR is set.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <optional>

#include "cli/commands.h"
#include "common/errors.h"
#include "trainer/config/config.h"
#include "trainer/train/train_loop.h"

namespace partrain::cli {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int fallback) {
  auto v = env(name);
  if (!v) return fallback;
  try {
    std::size_t used = 0;
    int value = std::stoi(*v, &used);
    if (used != v->size()) throw std::invalid_argument(*v);
    return value;
  } catch (const std::exception&) {
    throw UsageError(std::string("environment variable ") + name + "='" + *v +
                     "' is not an integer");
  }
}

WorkerEnv read_worker_env(const Config& config) {
  WorkerEnv w;
  if (env("RANK") || env("WORLD_SIZE")) {
    w.rank = env_int("RANK", 0);
    w.world_size = env_int("WORLD_SIZE", 1);
    w.local_rank = env_int("LOCAL_RANK", w.rank);
    w.local_world_size = env_int("LOCAL_WORLD_SIZE", w.world_size);
  } else if (env("SLURM_PROCID")) {
    w.rank = env_int("SLURM_PROCID", 0);
    w.world_size = env_int("SLURM_NTASKS", 1);
    w.local_rank = env_int("SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node; otherwise assume even spread.
    int nodes = env_int("SLURM_NNODES", 1);
    w.local_world_size =
        env_int("SLURM_NTASKS_PER_NODE", std::max(1, w.world_size / std::max(1, nodes)));
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    w.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    w.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    w.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    w.local_world_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  }
  PARTRAIN_CHECK(w.world_size >= 1 && w.rank >= 0 && w.rank < w.world_size, UsageError, "rank ",
                 w.rank, " is outside a world of size ", w.world_size);
  if (auto r = env("PARTRAIN_RENDEZVOUS")) {
    w.rendezvous = *r;
  } else if (!config.launch.rendezvous.empty()) {
    w.rendezvous = config.launch.rendezvous;
  } else if (env("MASTER_ADDR") && env("MASTER_PORT")) {
    w.rendezvous = "env://";
  }
  w.restart = env_int("PARTRAIN_RESTART", 0);
  // Each start of a restarted group is a run of its own to the store and the ring: keys and
  // connections of the start before must not be mistaken for this one's.
  w.token = env("PARTRAIN_RUN_TOKEN").value_or("");
  if (w.restart > 0) w.token += ".restart" + std::to_string(w.restart);
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
