// defines: Engine, EngineRank, read_engine_rank() — who this process is in a run and where the
// ranks of that run meet, read from the variables of whatever started it (partrain run,
// torchrun, Open MPI's mpirun, Slurm's srun); expand_slurm_hostlist() and
// expand_slurm_tasks_per_node(), the two Slurm formats that needs. LibTorch-free: both
// `partrain worker` and `partrain bench` use it.
//
// The rules (docs/clusters.md says the same for users):
//
//   rank, world   partrain run / torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE;
//                 mpirun: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE};
//                 srun: SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
//                 and this node's entry of SLURM_STEP_TASKS_PER_NODE. Slurm counts only inside
//                 a job step (SLURM_STEP_ID set): a batch script itself is not a rank. Checked in
//                 that order, so mpirun inside an sbatch allocation reads mpirun's variables.
//
//   rendezvous    the first that applies:
//                 1. PARTRAIN_RENDEZVOUS (set by partrain run; also a manual override)
//                 2. the configured url (launch.rendezvous, bench --rendezvous); env:// in it
//                    is resolved by rule 3
//                 3. MASTER_ADDR + MASTER_PORT: tcp://MASTER_ADDR:MASTER_PORT — except under
//                    torchrun's static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True), where
//                    torchrun's own store already listens on MASTER_PORT: then MASTER_PORT + 1
//                 4. a Slurm step: the first host of SLURM_STEP_NODELIST (else
//                    SLURM_JOB_NODELIST), resolved to an address, and MASTER_PORT if set, else
//                    kSlurmPortBase + SLURM_JOB_ID % kSlurmPortSpan
//                 else none ("").
//
//   token         PARTRAIN_RUN_TOKEN when set; otherwise derived from what every rank of the
//                 run sees alike (engine, its job or run id, the rendezvous, the world size),
//                 so the ranks agree without talking. A restart by the engine (torchrun's
//                 TORCHELASTIC_RESTART_COUNT, Slurm's SLURM_RESTART_COUNT, partrain's
//                 PARTRAIN_RESTART) appends ".restart<N>": a fresh run to stores and rings.
//                 Except under torchrun's dynamic rendezvous (c10d, etcd: no
//                 TORCHELASTIC_USE_AGENT_STORE=True), where a node that joins later counts its
//                 restarts from 0: there each round's fresh MASTER_PORT and world size tell the
//                 rounds apart (appended as ".round-<hash>" to PARTRAIN_RUN_TOKEN).
//
//   lock token    what OUTPUT/partrain.lock is held under (cli/worker_command.cpp): the token
//                 without the restart suffix, so that every start of the run is the same run;
//                 under a dynamic rendezvous PARTRAIN_RUN_TOKEN, else derived from the engine
//                 and TORCHELASTIC_RUN_ID (--rdzv_id) alone, as every round's world differs.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/rank_place.h"

namespace partrain::cli {

enum class Engine { none, partrain, torchrun, env, mpirun, slurm };
std::string engine_name(Engine engine);

// Ports derived from SLURM_JOB_ID fall in [kSlurmPortBase, kSlurmPortBase + kSlurmPortSpan):
// above the usual service ports, below Linux's ephemeral range (32768 and up).
inline constexpr int kSlurmPortBase = 10000;
inline constexpr int kSlurmPortSpan = 20000;

struct EngineRank : RankPlace {
  Engine engine = Engine::none;
  std::string rendezvous_from;  // where the url came from, for messages
  std::string lock_token;       // the run's name to the output lock, the same at every start
};

// Looks a variable up; nullopt when unset or empty. Tests pass a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();

// Turns a host name into the address a store can serve on and connect to (the first IPv4
// address, else the first IPv6 one); an IP address comes back as it is. Throws UsageError
// naming `what` when the name does not resolve.
using HostResolver = std::function<std::string(const std::string& host, const std::string& what)>;
std::string resolve_host(const std::string& host, const std::string& what);

// Throws UsageError (one line naming the variable) for malformed values.
EngineRank read_engine_rank(const EnvLookup& env, const std::string& configured_rendezvous,
                            const HostResolver& resolve = resolve_host);

// Slurm host lists as Slurm writes them: "node[01-03,07],gpu5" -> node01 node02 node03 node07
// gpu5. Ranges keep the zero padding of their first bound; several bracket groups in one name
// give every combination ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). Throws UsageError naming
// `what` (e.g. the variable) for unbalanced brackets, a reversed range, a non-number, or more
// than `max_hosts` names.
std::vector<std::string> expand_slurm_hostlist(const std::string& list, const std::string& what,
                                               std::size_t max_hosts = 1 << 20);

// SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_slurm_tasks_per_node(const std::string& text, const std::string& what);

}  // namespace partrain::cli
