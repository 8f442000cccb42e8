// defines: LaunchPlan and launch() — the process side of `partrain run`: start the local
// ranks as `partrain worker` processes, relay their output prefixed with `[rank N]`, watch
// them, stop the group when one fails, restart it up to max_restarts times. Also the rules
// it is built from (run token, rendezvous), exposed for tests. The worker lines it reads are
// common/worker_lines.h.
#pragma once

#include <chrono>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "trainer/config/node_layout.h"

namespace partrain::cli {

struct LaunchPlan {
  std::string executable;                // what to spawn (normally this partrain binary);
                                         // an absolute path, or a name searched in PATH
  std::vector<std::string> worker_args;  // e.g. {"worker", CONFIG, "--set", "a=b"}
  // What every node of one run shares, whatever its node-local paths (see choose_run_token);
  // "": the executable's name and worker_args stand in for it.
  std::string run_identity;
  // The ranks of every node of the run, one count per node (NodeLayout::per_node or
  // for_nodes): {2, 1} puts ranks 0-1 on node 0 and rank 2 on node 1. The same on every node.
  NodeLayout nodes = NodeLayout::per_node({1});
  int node_rank = 0;  // this node's index in `nodes`
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // 0: a free loopback port (single node only)
  std::string rendezvous;  // "": see rendezvous_for()
  int max_restarts = 0;
  std::chrono::milliseconds grace{3000};  // between the polite and the forced stop
  // After the launcher's own stop signal (or a worker's exit with kExitStopped): how long the
  // workers get to agree on a step, save it and exit by themselves before the forced stop.
  std::chrono::milliseconds stop_grace{3000};
  // 0: off. Otherwise each worker gets PARTRAIN_HEARTBEAT_S and prints a heartbeat line that
  // often (common/worker_lines.h); a worker silent for longer than silence_bound is taken for
  // frozen (SIGSTOP, a stalled host): it is killed and counts as failed.
  std::chrono::milliseconds heartbeat_interval{0};
  std::chrono::milliseconds silence_bound{0};
  // The CPUs each local rank is bound to, in local rank order (comm::bind_ranks(), Note
  // [Binding ranks to cores] in comm_backends/placement.cpp); empty: none is bound. Applied on
  // Linux; a rank the system would not bind runs unbound, and the launcher says so.
  std::vector<std::vector<int>> local_cpus;
  // Several nodes: says in the run's store (the rendezvous, the run token, then the rank and its
  // "rank R (HOST) stopped: WHY") why a rank of this node stopped where it could not say so
  // itself (killed by a signal: the kernel's out-of-memory killer, a crash), so that ranks on
  // other nodes that lost it give the reason (comm::RankGroup::tell_stopped()). Bounded by
  // itself; never throws. Unset: nothing is told (the launcher itself uses no store).
  std::function<void(const std::string&, const std::string&, int, const std::string&)>
      tell_rank_stopped;
  std::map<std::string, std::string> extra_env;  // set in every worker, last (wins)
  std::ostream* out = nullptr;                   // workers' stdout lines go here; null: std::cout
  std::ostream* err = nullptr;                   // their stderr lines and ours; null: std::cerr
};

// When a worker fails, the others on this node are stopped at once with one node, and after up
// to 1 s in which they may end by themselves with several (so that they can tell the other
// nodes, through the store, which rank they lost).
// Runs the plan to the end and returns the exit code for `partrain run`:
//   0    every worker exited 0
//   1    a worker failed (non-zero exit, a signal, on Windows a crash status) and no restart
//        was left; one line on err names the rank, its exit code, signal or status, the
//        epoch it was in, and the rank it lost when it said so (a peer on another node, say)
//   2    the first worker to fail exited 2: bad config or input data, which a restart
//        cannot fix, so the run ends at once with that code
//   75   kExitStopped (common/stop_request.h): a stop signal reached the launcher (or a worker
//        of another node stopped the run) and every worker saved the step it stopped at and
//        exited with that code; one line says "stopped at step N by SIGNAL; run the same
//        command to continue". No restart follows.
//   1 also when a worker was silent longer than silence_bound (see heartbeat_interval): it
//        is killed and named as frozen
//   128+s  the launcher got signal s (SIGINT: 130) and its workers did not all stop with
//        kExitStopped (0 when they all completed the run instead); every worker was stopped
//        first. On
//        Windows s stands for Ctrl-C (2), Ctrl-Break (21), the console closing (1) or the
//        stop event (15; platform::StopSignals)
// Throws UsageError for an invalid plan, Error when a worker cannot be started. Call it
// from a thread that lives until it returns (see platform_process_posix.cpp on the
// parent-death signal); it handles SIGINT, SIGTERM, SIGHUP and SIGUSR1 (Windows: console
// control events and the stop event) while it runs.
//
// Each worker gets the parent's environment plus RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GROUP_RANK, NODE_RANK (torchrun's names),
// PARTRAIN_RUN_TOKEN, PARTRAIN_RENDEZVOUS, PARTRAIN_RESTART (0, then 1 after the first
// restart, ...), PARTRAIN_HEARTBEAT_S (with a heartbeat_interval), OMP_NUM_THREADS (unless set:
// cores / this node's ranks, at least 1), then extra_env. Workers should flush each line: a pipe is
// not a terminal, so stdio buffers it.
int launch(const LaunchPlan& plan);

// The run token, shared by every rank of one run so a store or ring can refuse strangers:
//   * env_token (PARTRAIN_RUN_TOKEN in the launcher's environment) when not empty — the way
//     to give all nodes of a multi-node run one secret;
//   * one node: 128 random bits, in hex, fresh for each run;
//   * several nodes and no env_token: derived from what every node's command shares (master
//     address and port, the number of nodes, the ranks of each — one count when all nodes have
//     the same — and run_identity: partrain run puts there the resolved config without its
//     node-local keys, so a different --output or data.root on one node changes nothing), so
//     the nodes agree without talking. Another job on the same port gets another token and is
//     refused. Anyone who knows the command can compute it: set PARTRAIN_RUN_TOKEN to keep
//     others out.
std::string choose_run_token(const LaunchPlan& plan, const std::string& env_token);

// The store url the workers get (PARTRAIN_RENDEZVOUS): plan.rendezvous when given; with
// several nodes tcp://MASTER_ADDR:MASTER_PORT (rank 0's worker hosts that store); with one
// node `fresh_dir` as a file:// url — launch() makes a new directory under the system temp
// directory for each start of the group and removes them all at the end.
std::string rendezvous_for(const LaunchPlan& plan, const std::string& fresh_dir);

// A port on 127.0.0.1 that was free a moment ago (bound with port 0, then released).
int pick_free_loopback_port();

}  // namespace partrain::cli
