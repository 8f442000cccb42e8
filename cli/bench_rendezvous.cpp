// defines: add_rendezvous_bench() — `partrain bench rendezvous --world N`: N ranks joining one
// run through one tcp store, each doing what a rank does to join (the code a worker runs,
// not a model of it), timed from the store's first connection to the last rank past its
// clock estimate, with the requests the store answered, when the median rank passed each step,
// and how far each rank's clock estimate is from the truth (zero: they share one clock).
//
// The store's server runs in this process; the ranks run as threads of child processes
// (`bench rendezvous --join`), each rank with its own connection. Children, because a
// client costs about four descriptors (its socket and its io context's) and the server one
// a client: one process could hold only a quarter of what the server can serve. A child's
// threads are all started before any connects (a file gate), so thread start-up is not
// timed. What each rank does, in order:
//   1. connects to the store and passes the token hello, with   (open_store, as RankGroup)
//      its process's mark set in the same write                  (publish_process_on_join)
//   2. holds its config against rank 0's (a default Config's)   (agree_on_config: a barrier)
//   3. learns the host layout                                    (exchange_host_layout)
//   4. numbers its communicator                                  (make_communicator's add)
//   5. publishes its address, reads its right neighbour's         (asio-ring's transport)
//   6. estimates its clock's offset to rank 0's                  (estimate_clock_offset)
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
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
#include "comm_backends/backends/peer_process.h"
#include "comm_backends/communicator.h"
#include "comm_backends/net/open_files.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/placement.h"
#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"
#include "comm_backends/store/tcp_store.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/temp_dir.h"
#include "trainer/config/config_agreement.h"
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
// The six steps of the file comment, by the names the report gives them.
constexpr const char* kPhases[] = {"connect",   "config",    "layout",
                                   "numbering", "addresses", "clocks"};
constexpr std::size_t kPhaseCount = std::size(kPhases);
// What one rank reports: when it passed each step (steady clock ns), then its clock estimate
// (offset to rank 0 and the round trip it came from, ns).
constexpr std::size_t kRecordLength = kPhaseCount + 2;
using RankRecord = std::array<std::int64_t, kRecordLength>;

struct RendezvousArgs {
  int world = 0;
  double timeout_s = 300;
  int clock_readings = kClockRounds;
  bool remote_clock = false;
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

// One rank's join, exactly as a worker's rank makes it (see the file comment). Returns its
// store, still connected, as a rank goes on with it.
std::unique_ptr<comm::Store> join_as_rank(const RendezvousArgs& args, int rank,
                                          std::chrono::milliseconds timeout, RankRecord& record) {
  const int world = args.world;
  const auto passed = [&](std::size_t step) { record[step] = ns_of(Clock::now()); };
  comm::StoreOptions options;
  options.token = kToken;
  options.timeout = timeout;
  options.rank = rank;
  options.world_size = world;
  // Rank 0 runs where the store's server does (its launcher or its own process), as in a run.
  options.read_shared_clock_here = !args.remote_clock || rank == 0;
  comm::publish_process_on_join(options, rank);
  std::unique_ptr<comm::Store> store =
      comm::open_store("tcp://127.0.0.1:" + std::to_string(args.join_port), options);
  passed(0);
  static const std::string agreement = agreement_json(Config{});  // every rank's the same
  agree_on_config(*store, agreement, rank, world, timeout);
  passed(1);
  const comm::RankHosts hosts(*store, comm::kHostLayoutPrefix, rank, world);
  hosts.layout();
  passed(2);
  const std::int64_t instance = store->add("comm/instances/" + std::to_string(rank), 1);
  passed(3);
  const std::string prefix = comm::communicator_key_prefix(instance, "asio-ring");
  // The port is this rank's number: the address is published and read, never dialled.
  const std::string mine = comm::encode_peer_address(
      {"127.0.0.1:" + std::to_string(10000 + rank % 50000), comm::kernel_identity()});
  store->set(comm::peer_address_key(prefix, rank),
             std::vector<std::uint8_t>(mine.begin(), mine.end()));
  store->get(comm::peer_address_key(prefix, (rank + 1) % world));
  passed(4);
  const ClockEstimate clock =
      estimate_clock_offset(*store, rank, world, args.clock_readings, [](Clock::time_point t) {
        return std::chrono::duration<double>(t.time_since_epoch()).count();
      });
  record[kPhaseCount] = static_cast<std::int64_t>(clock.offset_s * 1e9);
  record[kPhaseCount + 1] = static_cast<std::int64_t>(clock.round_trip_s * 1e9);
  passed(5);
  return store;
}

// `bench rendezvous --join`: plays ranks first..first+count-1 as threads.
int run_child(const RendezvousArgs& args) {
  comm::net::raise_open_file_limit();
  const fs::path dir = args.dir;
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(args.timeout_s * 1000));
  std::mutex mutex;
  std::condition_variable gate;
  bool open = false;
  int finished = 0;  // ranks of this process past their join (or failed)
  std::vector<RankRecord> records(static_cast<std::size_t>(args.count), RankRecord{});
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
      std::unique_ptr<comm::Store> store;
      try {
        store =
            join_as_rank(args, rank, timeout, records[static_cast<std::size_t>(rank - args.first)]);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (failures++ == 0) first_error = "rank " + std::to_string(rank) + ": " + e.what();
      }
      // A rank goes on with its connection after the join; closing it at once, and the
      // thread's exit, would take the two cores from ranks still on their last step. So
      // each waits for every rank of this process (bounded by the timeout) before it ends.
      std::unique_lock<std::mutex> lock(mutex);
      if (++finished == args.count) gate.notify_all();  // once: a thousand waiters wake once
      gate.wait_for(lock, timeout, [&] { return finished == args.count; });
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
  std::vector<std::int64_t> flat;
  flat.reserve(records.size() * kRecordLength);
  for (const RankRecord& record : records) flat.insert(flat.end(), record.begin(), record.end());
  const json result = {{"ranks", flat}, {"failures", failures.load()}, {"error", first_error}};
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
  const std::string timeout_problem = comm::timeout_seconds_problem(args.timeout_s);
  PARTRAIN_CHECK(timeout_problem.empty(), UsageError, "bench rendezvous: --timeout-s ",
                 timeout_problem);
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
    std::vector<std::string> child_args = {"bench",
                                           "rendezvous",
                                           "--world",
                                           std::to_string(args.world),
                                           "--join",
                                           std::to_string(server.port()),
                                           "--dir",
                                           dir.string(),
                                           "--first",
                                           std::to_string(first),
                                           "--count",
                                           std::to_string(count),
                                           "--child",
                                           std::to_string(c),
                                           "--timeout-s",
                                           std::to_string(args.timeout_s),
                                           "--clock-readings",
                                           std::to_string(args.clock_readings)};
    if (args.remote_clock) child_args.push_back("--remote-clock");
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
  std::vector<RankRecord> records;
  records.reserve(static_cast<std::size_t>(args.world));
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
    const auto flat = result.at("ranks").get<std::vector<std::int64_t>>();
    PARTRAIN_CHECK(flat.size() % kRecordLength == 0, Error, "bench rendezvous: process ", c,
                   " wrote a result of another version");
    for (std::size_t at = 0; at < flat.size(); at += kRecordLength) {
      RankRecord& record = records.emplace_back();
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), kRecordLength, record.begin());
    }
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
  // Each step's last rank (what the run waits for) and its median rank; each rank's clock
  // estimate against the truth, which on one host is an offset of zero.
  const auto column = [&](std::size_t at) {
    std::vector<std::int64_t> values;
    values.reserve(records.size());
    for (const RankRecord& record : records) values.push_back(record[at]);
    std::sort(values.begin(), values.end());
    return values;
  };
  json phases = json::object();
  json medians = json::object();
  std::string last_text;
  std::string median_text;
  double seconds = 0;
  for (std::size_t p = 0; p < kPhaseCount; ++p) {
    const std::vector<std::int64_t> passed = column(p);
    const double last = since_first(passed.back());
    const double median = since_first(passed[passed.size() / 2]);
    phases[kPhases[p]] = last;
    medians[kPhases[p]] = median;
    if (p + 1 == kPhaseCount) seconds = last;
    char text[64] = {};
    std::snprintf(text, sizeof text, "%s%s %.3f", p == 0 ? "" : ", ", kPhases[p], last);
    last_text += text;
    std::snprintf(text, sizeof text, "%s%s %.3f", p == 0 ? "" : ", ", kPhases[p], median);
    median_text += text;
  }
  std::vector<double> clock_error_us;
  std::vector<double> clock_bound_us;
  for (const RankRecord& record : records) {
    clock_error_us.push_back(std::abs(static_cast<double>(record[kPhaseCount])) / 1e3);
    clock_bound_us.push_back(static_cast<double>(record[kPhaseCount + 1]) / 2e3);
  }
  std::sort(clock_error_us.begin(), clock_error_us.end());
  std::sort(clock_bound_us.begin(), clock_bound_us.end());
  const json clock = {{"error_us_median", clock_error_us[clock_error_us.size() / 2]},
                      {"error_us_max", clock_error_us.back()},
                      {"bound_us_median", clock_bound_us[clock_bound_us.size() / 2]},
                      {"bound_us_max", clock_bound_us.back()}};
  const std::uint64_t ops = server.requests_served();
  const std::optional<double> server_cpu = server.cpu_seconds();
  const json report = {{"schema", "partrain.bench.rendezvous/1"},
                       {"date", today()},
                       {"world", args.world},
                       {"seconds", seconds},
                       {"store_ops", ops},
                       {"store_ops_per_rank", static_cast<double>(ops) / args.world},
                       {"phases", phases},
                       {"phases_median_rank", medians},
                       {"clock_estimate", clock},
                       {"server_cpu_s", server_cpu ? json(*server_cpu) : json(nullptr)},
                       {"processes", children},
                       {"store", "tcp"}};
  std::printf(
      "rendezvous: world %d, %.3f s (first connection to the last rank past its "
      "clock estimate), store_ops %llu (%.2f a rank), %d process%s\n",
      args.world, seconds, static_cast<unsigned long long>(ops),
      static_cast<double>(ops) / args.world, children, children == 1 ? "" : "es");
  std::printf("  last rank past each step, s from the first connection: %s\n", last_text.c_str());
  std::printf("  median rank past each step: %s\n", median_text.c_str());
  std::printf(
      "  clock estimate against the truth (0 on one host): error median %.0f us, max %.0f us; "
      "its bound (half the round trip) median %.0f us, max %.0f us\n",
      clock_error_us[clock_error_us.size() / 2], clock_error_us.back(),
      clock_bound_us[clock_bound_us.size() / 2], clock_bound_us.back());
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
  sub->add_option("--clock-readings", args->clock_readings,
                  "Readings of the server's clock each rank's clock estimate keeps the best of "
                  "(what a worker takes by default; the answers a rank had before count)")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--remote-clock", args->remote_clock,
                "Ranks but rank 0 read the server's clock through round trips, as ranks on other "
                "hosts than the server's do (on its host a rank reads it itself)");
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
