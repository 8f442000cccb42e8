// defines: `partrain run CONFIG` — validates the config, then trains: in this process when
// the run is one rank without restarts (so a terminal gets a live progress bar), otherwise
// by launching `partrain worker` processes (cli/launcher.h) and watching them.
//
// With a `reference:` key, the run ends with the parity comparison when the single-device
// twin's report is at OUTPUT/baseline/report.json; `--with-baseline` trains that twin first
// (same config, one process, batch x ranks, so the total batch is equal).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/launcher.h"
#include "cli/platform_process.h"
#include "comm_backends/backends/failure_trace.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/placement.h"
#include "comm_backends/rank_group.h"
#include "comm_backends/store/store.h"
#include "comm_backends/store/tcp_store.h"
#include "trainer/parity/parity.h"
#include "common/errors.h"
#include "common/heartbeat.h"
#include "common/host_name.h"
#include "common/output_lock.h"
#include "trainer/config/config.h"
#include "trainer/config/config_agreement.h"
#include "trainer/device/torch_info.h"
#include "trainer/loop/worker.h"

namespace partrain::cli {
namespace {

// How long a checkpoint write may take after the ranks agreed to stop.
constexpr std::chrono::milliseconds kCheckpointAllowance{120000};
// Every worker's heartbeat, and how much longer than comm.timeout_s one may be silent before
// the launcher takes it for frozen and kills it.
constexpr std::chrono::milliseconds kHeartbeatInterval{2000};
constexpr std::chrono::milliseconds kSilenceGrace{10000};

struct RunOptions {
  ConfigArguments config;
  std::string nproc_per_node;  // "": from the config; "N", or "N0,N1,..." one count per node
  int nnodes = 0;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string output;
  bool with_baseline = false;
  bool trace = false;  // --trace: observe.trace=true
};

int run(const RunOptions& o);

// The config as every node of a multi-node run sees it: the keys every rank must hold alike
// (agreement_json(), trainer/config/config_agreement.h); those that name node-local things
// (folders, the NIC, thread counts) may differ between the nodes of one run, so they do not
// take part in the run token the nodes derive from it.
std::string run_identity(const Config& config) { return agreement_json(config); }

// --nproc-per-node: one count for every node, or one per node in node-rank order ("2,1").
// Throws UsageError naming what is wrong.
NodeLayout parse_nproc_per_node(const std::string& text) {
  std::vector<int> counts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    const bool digits = !item.empty() && item.size() <= 4 &&
                        item.find_first_not_of("0123456789") == std::string::npos;
    PARTRAIN_CHECK(digits && std::stoi(item) >= 1 && std::stoi(item) <= 1024, UsageError,
                   "--nproc-per-node '", text,
                   "': expected a count from 1 to 1024, or one such count per node separated by "
                   "commas (e.g. 2,1)");
    counts.push_back(std::stoi(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts.size() == 1 ? NodeLayout::every_node(counts.front()) : NodeLayout::per_node(counts);
}

// The ranks on each node of a run of `nnodes` nodes: --nproc-per-node, else
// launch.nproc_per_node, where auto is one rank per GPU with strategy ddp (1 otherwise).
NodeLayout ranks_per_node(const RunOptions& o, const Config& config, int nnodes) {
  if (!o.nproc_per_node.empty()) {
    return parse_nproc_per_node(o.nproc_per_node)
        .for_nodes(nnodes, 1, "--nproc-per-node '" + o.nproc_per_node + "'");
  }
  const NodeLayout& asked = config.launch.nproc_per_node;
  const int auto_count = asked.is_auto() && config.strategy == StrategyKind::kDdp
                             ? std::max(1, cuda_device_count())
                             : 1;
  return asked.for_nodes(nnodes, auto_count, "launch.nproc_per_node in " + config.source);
}

LaunchPlan plan_for(const RunOptions& o, const Config& config,
                    const std::vector<std::string>& overrides, const NodeLayout& nodes);

// The single-device twin of a parallel run: one process at the same total batch, the rest
// unchanged (loader threads included, so the pair differs only in parallelism).
int run_baseline(const RunOptions& o, const Config& parallel, int ranks) {
  RunOptions twin = o;
  twin.with_baseline = false;
  twin.nproc_per_node = "1";
  twin.nnodes = 1;
  twin.output = parallel.output_dir + "/baseline";
  twin.config.overrides.push_back("strategy=single");
  twin.config.overrides.push_back("launch.nproc_per_node=1");
  twin.config.overrides.push_back("launch.nnodes=1");
  // A global batch is already the total; a per-rank one grows to it.
  if (parallel.data.global_batch_size == 0) {
    twin.config.overrides.push_back("data.batch_size=" +
                                    std::to_string(parallel.data.batch_size * ranks));
  }
  std::cout << "partrain: training the single-device baseline into " << twin.output << "\n"
            << std::flush;
  return run(twin);
}

// The compute probe beside the twin: one process at one rank's batch and intra-op threads,
// alone on this host, for kProbeSteps optimizer steps (enough that its first steps, which
// allocate, weigh little). What a rank's forward and backward cost
// without the other ranks beside it, so that `partrain explain` can tell the cost of the
// smaller batch per rank (the probe against the twin) from the ranks' contention for the
// host's cores, memory and caches (the run against the probe).
constexpr int kProbeSteps = 100;
constexpr const char* kProbeFolder = "baseline-rank-batch";

int run_rank_batch_probe(const RunOptions& o, const Config& parallel, int ranks_here) {
  const std::int64_t batch =
      parallel.data.global_batch_size > 0
          ? std::max<std::int64_t>(1, micro_batch_size(parallel) / ranks_here)
          : parallel.data.batch_size;
  int threads = parallel.train.threads;
  if (threads == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, ranks_here));
  }
  RunOptions probe = o;
  probe.with_baseline = false;
  probe.trace = false;
  probe.nproc_per_node = "1";
  probe.nnodes = 1;
  probe.node_rank = 0;
  probe.output = parallel.output_dir + "/" + kProbeFolder;
  for (const char* s :
       {"strategy=single", "launch.nproc_per_node=1", "launch.nnodes=1", "launch.max_restarts=0",
        "data.global_batch_size=null", "data.balance=even", "checkpoint.every_epochs=0",
        "checkpoint.every_steps=0", "checkpoint.every_seconds=0", "checkpoint.resume=never",
        "observe.tensorboard=false", "observe.trace=false", "reference=null"}) {
    probe.config.overrides.push_back(s);
  }
  probe.config.overrides.push_back("data.batch_size=" + std::to_string(batch));
  probe.config.overrides.push_back("train.threads=" + std::to_string(threads));
  const std::int64_t steps = parallel.train.max_steps > 0
                                 ? std::min<std::int64_t>(parallel.train.max_steps, kProbeSteps)
                                 : kProbeSteps;
  probe.config.overrides.push_back("train.max_steps=" + std::to_string(steps));
  std::cout << "partrain: measuring compute at one rank's batch (" << batch << " samples, "
            << threads << " thread" << (threads == 1 ? "" : "s") << ", " << steps
            << " steps, alone) into " << probe.output << "\n"
            << std::flush;
  return run(probe);
}

void compare_with_reference(const Config& config) {
  std::string baseline = config.output_dir + "/baseline/report.json";
  std::string ours = config.output_dir + "/report.json";
  if (config.reference.empty() || !std::filesystem::exists(baseline) ||
      !std::filesystem::exists(ours))
    return;
  auto result = parity::compare({baseline, ours}, config.reference);
  parity::write_parity_outputs(result, config.output_dir + "/parity.md",
                               config.output_dir + "/parity.svg");
  std::cout << parity::to_markdown(result) << "partrain: parity against " << config.reference
            << (parity::exit_code(result) == 0 ? ": within tolerance" : ": OUTSIDE tolerance")
            << " (" << config.output_dir << "/parity.md, parity.svg)\n";
}

// Note [A node that could not start]
// A node of a multi-node `partrain run` that fails before its ranks start (its config missing
// or invalid on that host, its output folder held by another run) has no rank to tell the others
// through the store, and without the config it cannot derive the run token the store asks for.
// Rank 0's ranks, and those of every other node, would wait for its ranks until comm.timeout_s,
// then name ranks that did not arrive, without a reason. So the node tells the tcp store at
// --master-addr:--master-port one line, "node N (HOST) could not start its ranks: WHY", in a
// notice the server takes without a token (tell_tcp_store(), comm_backends/store/tcp_store.h):
// the server says it on the master's stderr at once and keeps it, and rank 0, while the ranks
// hold their configs against its own (settle() in trainer/config/config_agreement.cpp), ends
// that check with the line, which every rank that came stops with (exit 2). A notice that comes
// once the ranks have met only adds to the master's stderr and to its store timeouts' messages:
// it cannot stop a run that formed. Where the master is not there yet the node retries, for
// at most kTellReachBound (10 s), before it exits with its own error.
//
// Where the node that could not start is the master (node 0, started with --nnodes), there is
// no store for the others to find: their ranks would retry it until comm.timeout_s. Its
// launcher serves the store's port itself instead (stand_in_for_the_store()), answering every
// rank that comes, whatever its token, with the line (kStoreFailed), on which that rank stops
// (exit 2). It serves until kStandInQuiet (5 s) has passed since it began or since the last
// process it told or heard from, and at most kStandInBound (60 s) in all; Ctrl-C ends it
// sooner. Nodes started together (a cluster's script, srun) come within that; a node started
// by hand long after finds nobody, as before. A port it cannot take (another job's store there)
// leaves the others to their timeout, as before.
constexpr std::chrono::seconds kStandInQuiet{5};
constexpr std::chrono::seconds kStandInBound{60};

std::string could_not_start(const RunOptions& o, const std::string& why) {
  return "node " + std::to_string(o.node_rank) + " (" + this_host_name() +
         ") could not start its ranks: " + why;
}

void stand_in_for_the_store(const RunOptions& o, const std::string& why) {
  if (o.node_rank != 0 || o.nnodes <= 1 || o.master_port <= 0 || o.master_addr.empty()) return;
  std::unique_ptr<comm::TcpStoreServer> server;
  try {
    server = std::make_unique<comm::TcpStoreServer>(o.master_addr, o.master_port, "",
                                                    could_not_start(o, why));
  } catch (const std::exception&) {
    return;  // the port is taken, or the address is not this host's: nobody to tell from here
  }
  std::cerr << "partrain: " << why << "\npartrain: telling the ranks of the other nodes so on port "
            << o.master_port << " (until " << kStandInQuiet.count()
            << " s pass without one coming, at most " << kStandInBound.count()
            << " s; Ctrl-C ends it sooner)\n"
            << std::flush;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < kStandInBound) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto last = server->last_heard().value_or(start);
    if (std::chrono::steady_clock::now() - std::max(start, last) > kStandInQuiet) break;
  }
  const std::uint64_t told = server->told_clients();
  std::cerr << "partrain: answered " << told << " connection" << (told == 1 ? "" : "s")
            << " from the ranks of the other nodes\n"
            << std::flush;
}

void tell_master_this_node_stopped(const RunOptions& o, const std::string& why) {
  if (o.node_rank <= 0 || o.master_port <= 0 || o.master_addr.empty()) return;
  const TimedStderrLine note(
      "partrain: node " + std::to_string(o.node_rank) + " stopped; telling node 0's tcp store at " +
          comm::net::join_host_port(o.master_addr, o.master_port) + " why (at most " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::seconds>(kTellReachBound).count()) +
          " s)",
      kTellNoteAfter, std::chrono::seconds(0));
  comm::tell_tcp_store(o.master_addr, o.master_port, could_not_start(o, why), kTellReachBound);
}

// `partrain run` as the command line starts it: run(), and where this node cannot start its
// ranks, the other nodes are told why (Note [A node that could not start]). Once only: the
// baseline and the compute probe that run() starts inside are not nodes of the run.
int run_telling_the_other_nodes(const RunOptions& o) {
  try {
    return run(o);
  } catch (const std::exception& e) {
    tell_master_this_node_stopped(o, e.what());
    stand_in_for_the_store(o, e.what());
    throw;
  }
}

int run(const RunOptions& o) {
  std::vector<std::string> overrides = o.config.overrides;
  if (!o.output.empty()) overrides.push_back("output.dir=" + o.output);
  if (o.trace) overrides.push_back("observe.trace=true");
  Config config = load_config(o.config.path, overrides);

  const int nnodes = o.nnodes > 0 ? o.nnodes : config.launch.nnodes;
  PARTRAIN_CHECK(o.node_rank >= 0 && o.node_rank < nnodes, UsageError, "--node-rank ", o.node_rank,
                 " is outside [0, ", nnodes, ")");
  const NodeLayout nodes = ranks_per_node(o, config, nnodes);
  const int world = static_cast<int>(nodes.world_size());
  PARTRAIN_CHECK(world == 1 || config.strategy == StrategyKind::kDdp, UsageError, "strategy ",
                 name_of(config.strategy), " runs one process, but ", world,
                 " ranks were asked for; use strategy: ddp");
  // Before any process starts: a global batch the ranks cannot split is a usage error here.
  resolve_batch_size(config, world);

  if (o.with_baseline) {
    PARTRAIN_CHECK(
        config.strategy != StrategyKind::kSingle, UsageError,
        "--with-baseline compares a parallel run with one device; this config is strategy single");
    int code = run_baseline(o, config, config.strategy == StrategyKind::kDp ? 1 : world);
    if (code != 0) return code;
    // Ranks of one process each (not dp's devices of one process) get the compute probe.
    if (world > 1 && config.strategy == StrategyKind::kDdp) {
      code = run_rank_batch_probe(o, config, nodes.ranks_on(o.node_rank));
      if (code != 0) return code;
    }
  }
  // One run per output folder; the nodes of a multi-node run share the token, so they may
  // share the folder too.
  LaunchPlan plan = plan_for(o, config, overrides, nodes);
  const char* env_token = std::getenv("PARTRAIN_RUN_TOKEN");
  const std::string token = choose_run_token(plan, env_token != nullptr ? env_token : "");
  OutputLock lock(config.output_dir, token,
                  [](const std::string& line) { std::cerr << "partrain: " << line << "\n"; });
  int code = 0;
  if (world == 1 && config.launch.max_restarts == 0) {
    code = run_worker(config, WorkerEnv{});
  } else {
    code = launch(plan);
  }
  if (code == 0 && o.node_rank == 0) compare_with_reference(config);
  return code;
}

LaunchPlan plan_for(const RunOptions& o, const Config& config,
                    const std::vector<std::string>& overrides, const NodeLayout& nodes) {
  LaunchPlan plan;
  plan.executable = platform::executable_path();
  plan.worker_args = {"worker", o.config.path};
  for (const auto& s : overrides) {
    plan.worker_args.push_back("--set");
    plan.worker_args.push_back(s);
  }
  plan.run_identity = run_identity(config);
  plan.nodes = nodes;
  plan.node_rank = o.node_rank;
  plan.master_addr = o.master_addr;
  plan.master_port = o.master_port;
  plan.rendezvous = config.launch.rendezvous;
  plan.max_restarts = config.launch.max_restarts;
  // A stop signal: the ranks finish the step they are in (each wait bounded by
  // comm.timeout_s), agree, and rank 0 writes the checkpoint, which kCheckpointAllowance
  // bounds. A worker that writes nothing for longer than any wait of its own is frozen.
  const auto timeout = config.comm.timeout();
  plan.stop_grace = timeout + kCheckpointAllowance;
  plan.heartbeat_interval = kHeartbeatInterval;
  plan.silence_bound = timeout + kSilenceGrace;
  plan.tell_rank_stopped = [](const std::string& rendezvous, const std::string& token, int rank,
                              const std::string& sentence) {
    try {
      comm::StoreOptions options;
      options.token = token;
      options.timeout = comm::kTellStoppedBound;
      const std::unique_ptr<comm::Store> store = comm::open_store(rendezvous, options);
      store->set(comm::rank_stopped_key(rank),
                 std::vector<std::uint8_t>(sentence.begin(), sentence.end()));
    } catch (const std::exception&) {
      // The store is gone or unreachable: the others name the rank without a reason.
    }
  };
  // Ranks that train on the CPU get cores of their own (or share CPUs evenly where they
  // outnumber them); ranks on GPUs are left where the scheduler puts them (Note [Binding ranks to
  // cores] in comm_backends/placement.cpp).
  const bool on_cpu = config.device == DeviceChoice::kCpu ||
                      (config.device == DeviceChoice::kAuto && cuda_device_count() == 0);
  if (config.launch.bind == CpuBinding::kAuto && on_cpu) {
    plan.local_cpus = comm::bind_ranks(comm::allowed_cores(), nodes.ranks_on(o.node_rank));
  }
  return plan;
}

}  // namespace

void add_run_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("run", "Train: start the ranks of a config and watch them");
  auto o = std::make_shared<RunOptions>();
  add_config_arguments(*sub, o->config);
  sub->add_option("--nproc-per-node", o->nproc_per_node,
                  "Ranks on each machine (default: launch.nproc_per_node), or one count per "
                  "machine in node-rank order, the same list on every machine (2,1)");
  sub->add_option("--nnodes", o->nnodes, "Machines in the run (default: launch.nnodes)")
      ->check(CLI::Range(1, 65536));
  sub->add_option("--node-rank", o->node_rank, "This machine's index, 0-based")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--master-addr", o->master_addr, "Address of the machine with rank 0");
  sub->add_option("--master-port", o->master_port, "Port for the rendezvous store (0: pick one)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--output", o->output, "Output directory (overrides output.dir)");
  sub->add_flag("--with-baseline", o->with_baseline,
                "First train the single-device twin (into OUTPUT/baseline), then compare the "
                "pair with the config's reference");
  sub->add_flag("--trace", o->trace,
                "Write OUTPUT/trace.json: the spans of the steps in observe.trace_steps on every "
                "rank, on one clock (chrome://tracing, Perfetto)");
  sub->callback([o, &exit_code] {
    // Before any output: a rank trained in this process may end at a stop in its start-up
    // without flushing (run_worker()).
    line_buffer_stdout();
    exit_code = run_telling_the_other_nodes(*o);
  });
}

}  // namespace partrain::cli
