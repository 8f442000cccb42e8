// defines: add_rendezvous_bench() — `partrain bench rendezvous --world N`: N ranks joining one
// run through one tcp store, each doing what a rank does to join (the code a worker runs,
// not a model of it), timed from the store's first connection to the last rank past the
// final barrier, with the requests the store answered.
//
// The store's server runs in this process; the ranks run as threads of child processes
// (`bench rendezvous --join`), each rank with its own connection. Children, because a
// client costs about four descriptors (its socket and its io context's) and the server one
// a client: one process could hold only a quarter of what the server can serve. A child's
// threads are all started before any connects (a file gate), so thread start-up is not
// timed. What each rank does, in order:
//   1. connects to the store and passes the token hello        (open_store, as RankGroup)
//   2. learns the host layout                                    (exchange_host_layout)
//   3. numbers its communicator                                  (make_communicator's add)
//   4. publishes its address, reads its right neighbour's         (asio-ring's transport)
//   5. estimates its clock's offset to rank 0's                  (estimate_clock_offset)
//   6. passes a store barrier                                    (store_barrier)
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/process.hpp>

#include "cli/commands.h"
#include "cli/platform_process.h"
#include "comm_backends/communicator.h"
#include "comm_backends/net/open_files.h"
#include "comm_backends/placement.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/store/store.h"
#include "comm_backends/store/store_barrier.h"
#include "comm_backends/store/tcp_store.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/temp_dir.h"
#include "trainer/observe/clock_sync.h"

namespace partrain::cli {

namespace {

namespace fs = std::filesystem;
namespace bp = boost::process;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "partrain-bench-rendezvous";
// Descriptors one store client holds (socket, epoll, its eventfd and timerfd), and what a
// process keeps for itself beside its clients.
constexpr std::uint64_t kFdsPerClient = 4;
constexpr std::uint64_t kFdsSpare = 64;
constexpr int kMaxRanksPerChild = 1024;
constexpr auto kGatePoll = std::chrono::milliseconds(1);
// The five steps of the file comment, by the names the report gives them.
constexpr const char* kPhases[] = {"connect",   "layout", "numbering",
                                   "addresses", "clocks", "barrier"};
constexpr std::size_t kPhaseCount = std::size(kPhases);
using PhaseEnds = std::array<std::atomic<std::int64_t>, kPhaseCount>;

struct RendezvousArgs {
  int world = 0;
  double timeout_s = 300;
  std::string json_path;
  // A child's part (hidden): the store's port, the run folder, the ranks it plays.
  int join_port = 0;
  std::string dir;
  int first = 0;
  int count = 0;
  int child = 0;
};

std::int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Waits until `path` exists, polling (a file is the one gate both kinds of process see).
bool wait_for_file(const fs::path& path, Clock::time_point deadline) {
  while (!fs::exists(path)) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kGatePoll);
  }
  return true;
}

// Raises `latest` to now: when the last rank to finish a step finished it.
void mark(std::atomic<std::int64_t>& latest) {
  const std::int64_t now = ns_of(Clock::now());
  std::int64_t seen = latest.load();
  while (now > seen && !latest.compare_exchange_weak(seen, now)) {
  }
}

// One rank's join, exactly as a worker's rank makes it (see the file comment).
void join_as_rank(int port, int rank, int world, std::chrono::milliseconds timeout,
                  PhaseEnds& ends) {
  comm::StoreOptions options;
  options.token = kToken;
  options.timeout = timeout;
  options.rank = rank;
  options.world_size = world;
  const std::unique_ptr<comm::Store> store =
      comm::open_store("tcp://127.0.0.1:" + std::to_string(port), options);
  mark(ends[0]);
  const comm::RankHosts hosts(*store, comm::kHostLayoutPrefix, rank, world);
  hosts.layout();
  mark(ends[1]);
  const std::int64_t instance = store->add("comm/instances/" + std::to_string(rank), 1);
  mark(ends[2]);
  const std::string prefix = comm::communicator_key_prefix(instance, "asio-ring");
  // The port is this rank's number: the address is published and read, never dialled.
  const std::string mine = "127.0.0.1:" + std::to_string(10000 + rank % 50000);
  store->set(comm::peer_address_key(prefix, rank),
             std::vector<std::uint8_t>(mine.begin(), mine.end()));
  store->get(comm::peer_address_key(prefix, (rank + 1) % world));
  mark(ends[3]);
  estimate_clock_offset(*store, rank, world, kClockRounds, [] {
    return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  });
  mark(ends[4]);
  comm::store_barrier(*store, "bench/joined", rank, world, timeout);
  mark(ends[5]);
}

// `bench rendezvous --join`: plays ranks first..first+count-1 as threads.
int run_child(const RendezvousArgs& args) {
  comm::net::raise_open_file_limit();
  const fs::path dir = args.dir;
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(args.timeout_s * 1000));
  std::mutex mutex;
  std::condition_variable gate;
  bool open = false;
  PhaseEnds ends{};
  std::atomic<int> failures{0};
  std::string first_error;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(args.count));
  for (int i = 0; i < args.count; ++i) {
    const int rank = args.first + i;
    threads.emplace_back([&, rank] {
      {
        std::unique_lock<std::mutex> lock(mutex);
        // Bounded: the main thread opens the gate, or gives up, within the timeout.
        gate.wait_for(lock, timeout, [&] { return open; });
      }
      try {
        join_as_rank(args.join_port, rank, args.world, timeout, ends);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (failures++ == 0) first_error = "rank " + std::to_string(rank) + ": " + e.what();
      }
    });
  }
  write_file_atomically((dir / ("ready-" + std::to_string(args.child))).string(), "ready");
  const bool go = wait_for_file(dir / "go", Clock::now() + timeout);
  {
    std::lock_guard<std::mutex> lock(mutex);
    open = true;
    if (!go) {
      failures = args.count;
      first_error = "the start gate never opened";
    }
  }
  gate.notify_all();
  for (auto& thread : threads) thread.join();
  std::vector<std::int64_t> phase_ends;
  for (const auto& end : ends) phase_ends.push_back(end.load());
  const json result = {
      {"phase_ends_ns", phase_ends}, {"failures", failures.load()}, {"error", first_error}};
  write_file_atomically((dir / ("result-" + std::to_string(args.child) + ".json")).string(),
                        result.dump());
  return failures == 0 ? 0 : 1;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[32] = {};
  std::strftime(text, sizeof text, "%Y-%m-%d", std::gmtime(&now));
  return text;
}

int run_bench(const RendezvousArgs& args) {
  PARTRAIN_CHECK(args.world >= 1, UsageError, "bench rendezvous: --world must be at least 1");
  PARTRAIN_CHECK(args.timeout_s > 0, UsageError, "bench rendezvous: --timeout-s must be positive");
  const auto world = static_cast<std::uint64_t>(args.world);
  // The server holds one descriptor a rank: past this process's limit, nothing else helps.
  const comm::net::OpenFileLimit limit = comm::net::raise_open_file_limit();
  PARTRAIN_CHECK(!limit.known || world + kFdsSpare <= limit.soft, UsageError,
                 "bench rendezvous: ", args.world, " ranks need ", world + kFdsSpare,
                 " open files in the store's process, but this process may open ", limit.soft,
                 " (hard limit ", limit.hard, "); raise the hard limit (ulimit -Hn, as root) ",
                 "or use a smaller --world");
  const std::uint64_t per_child_by_fds =
      limit.known ? (limit.soft - kFdsSpare) / kFdsPerClient : kMaxRanksPerChild;
  const int per_child =
      static_cast<int>(std::min<std::uint64_t>(per_child_by_fds, kMaxRanksPerChild));
  const int children = (args.world + per_child - 1) / per_child;
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(args.timeout_s * 1000));

  const TempDir dir("partrain-bench-rdzv");
  comm::TcpStoreServer server("127.0.0.1", 0, kToken);
  const std::string executable = platform::executable_path();
  std::vector<bp::child> processes;
  for (int c = 0; c < children; ++c) {
    const int first = c * per_child;
    const int count = std::min(per_child, args.world - first);
    const std::vector<std::string> child_args = {"bench",       "rendezvous",
                                                 "--world",     std::to_string(args.world),
                                                 "--join",      std::to_string(server.port()),
                                                 "--dir",       dir.string(),
                                                 "--first",     std::to_string(first),
                                                 "--count",     std::to_string(count),
                                                 "--child",     std::to_string(c),
                                                 "--timeout-s", std::to_string(args.timeout_s)};
    try {
      processes.emplace_back(bp::exe = executable, bp::args = child_args, bp::std_in < bp::null);
    } catch (const std::exception& e) {
      throw Error(detail::concat("bench rendezvous: cannot start a process for ranks ", first, "..",
                                 first + count - 1, ": ", e.what()));
    }
  }
  const auto deadline = Clock::now() + timeout;
  bool ready = true;
  for (int c = 0; c < children && ready; ++c) {
    ready = wait_for_file(dir.path() / ("ready-" + std::to_string(c)), deadline);
  }
  write_file_atomically((dir.path() / "go").string(), ready ? "go" : "no");
  // A child ends when its ranks have joined or failed. A failing rank's longest chain is
  // rank 0's host layout: its own group's keys, then the other groups', each waited for up to
  // the timeout; the later steps fail at once after it. A little more is allowed for exits.
  const auto end_by = Clock::now() + 2 * timeout + std::chrono::seconds(30);
  std::vector<bool> stopped(processes.size(), false);
  for (std::size_t c = 0; c < processes.size(); ++c) {
    while (processes[c].running() && Clock::now() < end_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (processes[c].running()) {
      processes[c].terminate();
      stopped[c] = true;
    }
    processes[c].wait();
  }
  PARTRAIN_CHECK(ready, Error, "bench rendezvous: not every process started its ranks within ",
                 args.timeout_s, " s");

  // Every result is read before any failure is reported, so that the first rank error is
  // named even when another process has none to show.
  std::vector<std::int64_t> phase_ends(kPhaseCount, 0);
  int failures = 0;
  std::string error;
  std::string lost;  // processes without a result
  for (int c = 0; c < children; ++c) {
    std::ifstream in(dir.path() / ("result-" + std::to_string(c) + ".json"));
    if (!in.good()) {
      const int first = c * per_child;
      const int last = std::min(args.world, first + per_child) - 1;
      if (lost.empty()) {
        lost =
            detail::concat("; the process of ranks ", first, "..", last,
                           stopped[c] ? " was stopped, still running after the bound on its waits"
                                      : " ended without a result (exit " +
                                            std::to_string(processes[c].exit_code()) + ")");
      }
      continue;
    }
    const json result = json::parse(in);
    const auto ends = result.at("phase_ends_ns").get<std::vector<std::int64_t>>();
    PARTRAIN_CHECK(ends.size() == kPhaseCount, Error, "bench rendezvous: process ", c,
                   " wrote a result of another version");
    for (std::size_t p = 0; p < kPhaseCount; ++p) phase_ends[p] = std::max(phase_ends[p], ends[p]);
    failures += result.at("failures").get<int>();
    if (error.empty()) error = result.at("error").get<std::string>();
  }
  PARTRAIN_CHECK(failures == 0 && lost.empty(), Error, "bench rendezvous: ", failures, " of ",
                 args.world, " ranks reported that they did not join",
                 error.empty() ? std::string() : "; first: " + error, lost);
  const auto first = server.first_connection();
  PARTRAIN_CHECK(first.has_value(), Error, "bench rendezvous: no rank connected");
  const auto since_first = [&](std::int64_t ns) {
    return static_cast<double>(ns - ns_of(*first)) / 1e9;
  };
  const double seconds = since_first(phase_ends.back());
  json phases = json::object();
  std::string phase_text;
  for (std::size_t p = 0; p < kPhaseCount; ++p) {
    phases[kPhases[p]] = since_first(phase_ends[p]);
    char text[64] = {};
    std::snprintf(text, sizeof text, "%s%s %.3f", p == 0 ? "" : ", ", kPhases[p],
                  since_first(phase_ends[p]));
    phase_text += text;
  }
  const std::uint64_t ops = server.requests_served();
  const std::optional<double> server_cpu = server.cpu_seconds();
  const json report = {{"schema", "partrain.bench.rendezvous/1"},
                       {"date", today()},
                       {"world", args.world},
                       {"seconds", seconds},
                       {"store_ops", ops},
                       {"store_ops_per_rank", static_cast<double>(ops) / args.world},
                       {"phases", phases},
                       {"server_cpu_s", server_cpu ? json(*server_cpu) : json(nullptr)},
                       {"processes", children},
                       {"store", "tcp"}};
  std::printf(
      "rendezvous: world %d, %.3f s (first connection to the last rank past the "
      "barrier), store_ops %llu (%.2f a rank), %d process%s\n",
      args.world, seconds, static_cast<unsigned long long>(ops),
      static_cast<double>(ops) / args.world, children, children == 1 ? "" : "es");
  std::printf("  last rank past each step, s from the first connection: %s\n", phase_text.c_str());
  if (server_cpu) {
    std::printf("  the store's server thread used %.3f s of CPU (the ranks' threads the rest)\n",
                *server_cpu);
  }
  if (!args.json_path.empty()) write_file_atomically(args.json_path, report.dump(2) + "\n");
  return 0;
}

}  // namespace

void add_rendezvous_bench(CLI::App& bench, int& exit_code) {
  auto* sub = bench.add_subcommand(
      "rendezvous",
      "Time N ranks joining one run through one tcp store (each rank a thread with its own "
      "connection, doing what a worker does to join): seconds and store requests");
  auto args = std::make_shared<RendezvousArgs>();
  sub->add_option("--world", args->world, "Number of ranks to play")->required();
  sub->add_option("--timeout-s", args->timeout_s, "Bound on every wait of every rank");
  sub->add_option("--json", args->json_path, "Write world, seconds and store_ops here");
  // A child process's part; not for users.
  sub->add_option("--join", args->join_port)->group("");
  sub->add_option("--dir", args->dir)->group("");
  sub->add_option("--first", args->first)->group("");
  sub->add_option("--count", args->count)->group("");
  sub->add_option("--child", args->child)->group("");
  sub->callback([args, &exit_code] {
    exit_code = args->join_port > 0 ? run_child(*args) : run_bench(*args);
  });
}

}  // namespace partrain::cli
