// defines: add_bench_command() — `partrain bench allreduce`: per message size the median
// time, algbw, busbw and a count of wrong elements, for one or several backends in one run,
// each rank a separate process (nccl-tests is the model).
//
// Two ways to get the ranks:
//   * started here: the launcher (cli/launcher.h, as partrain run uses it) starts --world
//     ranks as `partrain bench allreduce ...` processes on this host, or world / --nnodes on
//     each of several hosts given the same --nnodes --node-rank --master-addr --master-port
//     flags as partrain run. Rank 0 writes its results to PARTRAIN_BENCH_RESULTS; the
//     process that started it (node 0's) prints the table and writes --json.
//   * started by mpirun, srun or torchrun: each process is one rank, found and rendezvoused
//     as partrain worker does (cli/engine_env.h); rank 0 prints and writes --json.
// Each iteration refills the buffer, passes a barrier, times one allreduce and checks every
// element; an iteration's time is the slowest rank's.
#include <CLI/CLI.hpp>

#include <cstring>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <system_error>

#include "cli/bench_memory.h"
#include "cli/commands.h"
#include "cli/engine_env.h"
#include "cli/launcher.h"
#include "cli/platform_process.h"
#include "comm_backends/communicator.h"
#include "comm_backends/rank_group.h"
#include "common/errors.h"
#include "common/atomic_file.h"
#include "common/temp_dir.h"

namespace partrain::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kResultsVariable = "PARTRAIN_BENCH_RESULTS";

struct BenchArgs {
  std::string backends = "asio-ring";
  int world = 0;  // 0: not given
  std::string sizes = "4K,64K,1M,16M";
  std::string dtype = "f32";
  std::string wire_dtype = "f32";
  int iters = 0;  // 0: by size
  int warmup = 3;
  double timeout_s = 120;
  std::string json_path;
  // Across hosts.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string host;        // where this host's ranks listen; "": chosen as partrain run does
  std::string rendezvous;  // under mpirun/srun/torchrun
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

std::size_t parse_size(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  PARTRAIN_CHECK(digits > 0 && digits <= 12, UsageError, "bench: size '", text,
                 "' is not a number with an optional K, M or G suffix");
  std::size_t value = std::stoull(text.substr(0, digits));
  const std::string suffix = text.substr(digits);
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    value <<= 10;
  else if (suffix == "M" || suffix == "MiB")
    value <<= 20;
  else if (suffix == "G" || suffix == "GiB")
    value <<= 30;
  else
    PARTRAIN_CHECK(suffix.empty() || suffix == "B", UsageError, "bench: size '", text,
                   "' has an unknown suffix (use K, M or G)");
  return value;
}

std::string human_size(std::size_t bytes) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

int iterations_for(std::size_t bytes) {  // as the Gloo peer benchmark picks them
  if (bytes <= (64u << 10)) return 200;
  if (bytes <= (1u << 20)) return 100;
  if (bytes <= (4u << 20)) return 40;
  if (bytes <= (16u << 20)) return 15;
  if (bytes <= (64u << 20)) return 8;
  return 5;
}

// The buffer repeats a period of values whose sum over W ranks is exact in every dtype, f16
// and bf16 included: rank + 1 + (i mod P). Fill and check work a period at a time with
// memcpy/memcmp, so that preparing and checking each iteration costs about as much as
// touching the memory once (as in Gloo's own benchmark), not a conversion per element.
std::size_t pattern_period(bool narrow) { return narrow ? 16 : 1024; }

std::vector<std::uint8_t> encode_period(comm::DType dtype, std::size_t period, double first,
                                        double step) {
  using comm::DType;
  const std::size_t size = comm::dtype_size(dtype);
  std::vector<std::uint8_t> out(period * size);
  for (std::size_t i = 0; i < period; ++i) {
    const double v = first + step * static_cast<double>(i);
    std::uint8_t* at = out.data() + i * size;
    switch (dtype) {
      case DType::f32: {
        float x = static_cast<float>(v);
        std::memcpy(at, &x, size);
        break;
      }
      case DType::f64:
        std::memcpy(at, &v, size);
        break;
      case DType::f16: {
        auto x = comm::float_to_half(static_cast<float>(v));
        std::memcpy(at, &x, size);
        break;
      }
      case DType::bf16: {
        auto x = comm::float_to_bf16(static_cast<float>(v));
        std::memcpy(at, &x, size);
        break;
      }
      case DType::i32: {
        auto x = static_cast<std::int32_t>(v);
        std::memcpy(at, &x, size);
        break;
      }
      case DType::i64: {
        auto x = static_cast<std::int64_t>(v);
        std::memcpy(at, &x, size);
        break;
      }
    }
  }
  return out;
}

void fill(void* data, std::size_t bytes, const std::vector<std::uint8_t>& period) {
  auto* out = static_cast<std::uint8_t*>(data);
  for (std::size_t at = 0; at < bytes; at += period.size()) {
    std::memcpy(out + at, period.data(), std::min(period.size(), bytes - at));
  }
}

std::int64_t count_wrong(const void* data, std::size_t bytes, std::size_t element_size,
                         const std::vector<std::uint8_t>& expected) {
  const auto* in = static_cast<const std::uint8_t*>(data);
  std::int64_t wrong = 0;
  for (std::size_t at = 0; at < bytes; at += expected.size()) {
    const std::size_t n = std::min(expected.size(), bytes - at);
    if (std::memcmp(in + at, expected.data(), n) == 0) continue;
    for (std::size_t e = 0; e < n; e += element_size) {
      wrong += std::memcmp(in + at + e, expected.data() + e, element_size) != 0;
    }
  }
  return wrong;
}

// ---- one rank -------------------------------------------------------------------------------

struct RankResults {
  json results = json::array();
  bool all_right = true;
};

// Reduces a few host values over `comm`, through device memory where the backend needs it.
void reduce_host_values(comm::Communicator& comm, comm::DeviceKind kind, int device, void* values,
                        std::size_t count, comm::DType dtype, comm::ReduceOp op) {
  const std::size_t bytes = count * comm::dtype_size(dtype);
  BenchMemory memory(bytes, kind, device);
  std::memcpy(memory.host(), values, bytes);
  memory.to_collective(bytes);
  comm.allreduce(memory.buffer(count, dtype), op);
  memory.from_collective(bytes);
  std::memcpy(values, memory.host(), bytes);
}

RankResults run_rank(const BenchArgs& args, const EngineRank& me) {
  const comm::DType dtype = comm::parse_dtype(args.dtype);
  const comm::DType wire = comm::parse_dtype(args.wire_dtype);
  const bool narrow = comm::dtype_size(dtype) == 2 || comm::dtype_size(wire) == 2;
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(args.timeout_s * 1000));
  PARTRAIN_CHECK(!me.rendezvous.empty(), UsageError, "bench: no rendezvous for ", me.world_size,
                 " ranks started by ", engine_name(me.engine),
                 ": set MASTER_ADDR and MASTER_PORT, --rendezvous or PARTRAIN_RENDEZVOUS");
  // Opened as training opens its ranks; they listen on --host, else where training would (the
  // route to the master, PARTRAIN_SOCKET_IFNAME, loopback when every rank is here).
  comm::RankGroupOptions group_options;
  static_cast<RankPlace&>(group_options) = me;
  group_options.timeout = timeout;
  group_options.host = args.host;
  const auto group = comm::open_rank_group(group_options);

  std::vector<std::size_t> sizes;
  for (const auto& s : split(args.sizes)) sizes.push_back(parse_size(s));
  const std::size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  const int devices = cuda_devices();
  RankResults out;

  for (const auto& backend : split(args.backends)) {
    // NCCL reduces device memory only: its ranks get a device each, the others host memory.
    const bool on_device = backend == "nccl";
    const int device = on_device ? me.local_rank % devices : 0;
    const auto memory_kind = on_device ? comm::DeviceKind::cuda : comm::DeviceKind::cpu;
    BenchMemory memory(max_bytes + 64, memory_kind, device);
    comm::CommOptions options = group->comm_options();
    options.backend = backend;
    options.wire_dtype = wire;
    options.device = memory_kind;
    options.device_index = device;
    auto comm = group->make_communicator(options);
    for (std::size_t bytes : sizes) {
      const std::size_t count = bytes / comm::dtype_size(dtype);
      const int iters = args.iters > 0 ? args.iters : iterations_for(bytes);
      std::vector<double> seconds;
      std::int64_t wrong = 0;
      const std::size_t period = pattern_period(narrow);
      const auto mine = encode_period(dtype, period, me.rank + 1, 1.0);
      const auto expected =
          encode_period(dtype, period, me.world_size * (me.world_size + 1) / 2.0, me.world_size);
      const std::size_t used = count * comm::dtype_size(dtype);
      for (int it = 0; it < args.warmup + iters; ++it) {
        fill(memory.host(), used, mine);
        memory.to_collective(used);
        comm->barrier();
        const auto start = Clock::now();
        comm->allreduce(memory.buffer(count, dtype), comm::ReduceOp::sum);
        const auto stop = Clock::now();
        memory.from_collective(used);
        wrong += count_wrong(memory.host(), used, comm::dtype_size(dtype), expected);
        if (it >= args.warmup)
          seconds.push_back(std::chrono::duration<double>(stop - start).count());
      }
      reduce_host_values(*comm, memory_kind, device, seconds.data(), seconds.size(),
                         comm::DType::f64, comm::ReduceOp::max);
      reduce_host_values(*comm, memory_kind, device, &wrong, 1, comm::DType::i64,
                         comm::ReduceOp::sum);
      std::sort(seconds.begin(), seconds.end());
      const double median = seconds[seconds.size() / 2];
      const double algbw = static_cast<double>(bytes) / median / 1e9;
      out.all_right &= wrong == 0;
      out.results.push_back({{"backend", backend},
                             {"bytes", bytes},
                             {"iters", iters},
                             {"median_us", median * 1e6},
                             {"min_us", seconds.front() * 1e6},
                             {"algbw_gbps", algbw},
                             {"busbw_gbps", algbw * 2.0 * (me.world_size - 1) / me.world_size},
                             {"wrong", wrong}});
    }
  }
  return out;
}

// ---- reporting ------------------------------------------------------------------------------

void print_table(const json& results, const BenchArgs& args, int world, const std::string& where) {
  std::printf("# partrain bench allreduce  world=%d  dtype=%s  wire=%s  sum, %d processes, %s\n",
              world, args.dtype.c_str(), args.wire_dtype.c_str(), world, where.c_str());
  std::printf("%-10s %12s %9s %6s %12s %12s %12s %7s\n", "backend", "bytes", "size", "iters",
              "median_us", "algbw_GB/s", "busbw_GB/s", "wrong");
  for (const auto& r : results) {
    std::printf(
        "%-10s %12zu %9s %6d %12.1f %12.3f %12.3f %7lld\n", r["backend"].get<std::string>().c_str(),
        r["bytes"].get<std::size_t>(), human_size(r["bytes"].get<std::size_t>()).c_str(),
        r["iters"].get<int>(), r["median_us"].get<double>(), r["algbw_gbps"].get<double>(),
        r["busbw_gbps"].get<double>(), static_cast<long long>(r["wrong"].get<std::int64_t>()));
  }
  std::fflush(stdout);
}

// The table, the --json report, and exit code 1 when any element was wrong.
int report(const json& results, const BenchArgs& args, int world, const std::string& where) {
  print_table(results, args, world, where);
  bool all_right = true;
  for (const auto& r : results) all_right &= r["wrong"].get<std::int64_t>() == 0;
  if (!args.json_path.empty()) {
    const json report = {
        {"schema", "partrain.bench/1"}, {"collective", "allreduce"},     {"world", world},
        {"dtype", args.dtype},          {"wire_dtype", args.wire_dtype}, {"results", results}};
    write_file_atomically(args.json_path, report.dump(2) + "\n");
  }
  PARTRAIN_CHECK(all_right, Error, "bench: some results were wrong (see the wrong column)");
  return 0;
}

// ---- checks and the two ways to run ---------------------------------------------------------

void check_args(const BenchArgs& args, int world) {
  PARTRAIN_CHECK(world >= 1 && world <= 1024, UsageError, "bench: --world must be 1..1024");
  const comm::DType dtype = comm::parse_dtype(args.dtype);
  comm::parse_dtype(args.wire_dtype);
  PARTRAIN_CHECK(args.timeout_s > 0, UsageError, "bench: --timeout-s must be positive");
  PARTRAIN_CHECK(args.warmup >= 0 && args.iters >= 0, UsageError,
                 "bench: --iters and --warmup must be 0 or more");
  const auto backends = split(args.backends);
  PARTRAIN_CHECK(!backends.empty(), UsageError, "bench: --backend names no backend");
  for (const auto& b : backends) {
    const auto names = comm::backend_names();
    PARTRAIN_CHECK(std::find(names.begin(), names.end(), b) != names.end(), UsageError,
                   "bench: unknown backend '", b, "'");
    PARTRAIN_CHECK(comm::backend_compiled_in(b), UsageError, "bench: backend '", b,
                   "' is not compiled into this build");
    // auto would pick a backend by where the buffer lives, which the bench decides itself.
    PARTRAIN_CHECK(b != "auto", UsageError, "bench: name the backend to measure, not auto");
    PARTRAIN_CHECK(b != "nccl" || cuda_devices() > 0, UsageError,
                   "bench: --backend nccl needs a CUDA device (NCCL reduces device memory only) "
                   "and this machine has none; measure gloo or asio-ring here");
  }
  const auto sizes = split(args.sizes);
  PARTRAIN_CHECK(!sizes.empty(), UsageError, "bench: --sizes names no size");
  for (const auto& s : sizes) {
    const std::size_t bytes = parse_size(s);
    PARTRAIN_CHECK(bytes > 0 && bytes % comm::dtype_size(dtype) == 0, UsageError, "bench: size ", s,
                   " is not a positive multiple of the ", args.dtype, " element size");
  }
}

// A rank under an engine (or under our own launcher, which passes the results file).
int run_as_rank(const BenchArgs& args, const EngineRank& me) {
  PARTRAIN_CHECK(args.world == 0 || args.world == me.world_size, UsageError, "bench: --world ",
                 args.world, " but ", engine_name(me.engine), " started ", me.world_size,
                 " ranks; leave --world out under an engine");
  PARTRAIN_CHECK(args.nnodes == 1 && args.node_rank == 0, UsageError,
                 "bench: --nnodes/--node-rank start ranks; under ", engine_name(me.engine),
                 " each process is already one rank");
  check_args(args, me.world_size);
  const RankResults mine = run_rank(args, me);
  if (me.rank != 0) return mine.all_right ? 0 : 1;  // rank 0 says why
  const char* results_file = std::getenv(kResultsVariable);
  if (me.engine == Engine::partrain && results_file != nullptr && *results_file != '\0') {
    write_file_atomically(results_file, mine.results.dump());
    return 0;  // the process that started us checks and reports
  }
  return report(mine.results, args, me.world_size, "started by " + engine_name(me.engine));
}

int start_ranks(const BenchArgs& args) {
  PARTRAIN_CHECK(
      args.world > 0, UsageError,
      "bench: --world is required (unless mpirun, srun or torchrun started this process)");
  PARTRAIN_CHECK(args.nnodes >= 1 && args.world % args.nnodes == 0, UsageError, "bench: --world ",
                 args.world, " is not a multiple of --nnodes ", args.nnodes);
  check_args(args, args.world);
  const TempDir dir("partrain-bench");
  const fs::path results_path = dir.path() / "results.json";

  LaunchPlan plan;
  plan.executable = platform::executable_path();
  // Every node passes the same arguments: with several nodes the run token is derived from
  // them (launcher.h), so per-node paths travel in the environment instead.
  plan.worker_args = {"bench",        "allreduce",
                      "--backend",    args.backends,
                      "--world",      std::to_string(args.world),
                      "--sizes",      args.sizes,
                      "--dtype",      args.dtype,
                      "--wire-dtype", args.wire_dtype,
                      "--iters",      std::to_string(args.iters),
                      "--warmup",     std::to_string(args.warmup),
                      "--timeout-s",  std::to_string(args.timeout_s)};
  // What every node shares, for the run token: the address this host listens on is its own.
  for (const auto& arg : plan.worker_args) plan.run_identity += arg + '\n';
  if (!args.host.empty()) plan.worker_args.insert(plan.worker_args.end(), {"--host", args.host});
  plan.nodes = NodeLayout::per_node(std::vector<int>(args.nnodes, args.world / args.nnodes));
  plan.node_rank = args.node_rank;
  plan.master_addr = args.master_addr;
  plan.master_port = args.master_port;
  plan.extra_env[kResultsVariable] = results_path.string();
  // launch() stops every rank it started when one fails, or cannot be started at all.
  const int code = launch(plan);
  if (code != 0) return code;
  if (args.node_rank != 0) {
    std::printf("bench: the %d ranks of node %d finished; node 0 prints the results\n",
                plan.nodes.ranks_on(args.node_rank), args.node_rank);
    return 0;
  }
  std::ifstream in(results_path);
  PARTRAIN_CHECK(in.good(), Error, "bench: rank 0 wrote no results");
  const json results = json::parse(in);
  const std::string where = args.nnodes == 1 ? "one host" : std::to_string(args.nnodes) + " hosts";
  return report(results, args, args.world, where);
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Collective and rendezvous benchmarks");
  bench->require_subcommand(1);
  add_rendezvous_bench(*bench, exit_code);
  auto* allreduce = bench->add_subcommand(
      "allreduce",
      "Time allreduce across W processes: median, algbw, busbw, wrong. Starts the ranks itself "
      "(on one host, or with --nnodes on several), or runs as one rank under mpirun, srun or "
      "torchrun");
  auto args = std::make_shared<BenchArgs>();
  std::string backend_help = "Backends, comma-separated; compiled in here:";
  for (const auto& name : comm::backend_names()) {
    if (name != "auto" && comm::backend_compiled_in(name)) backend_help += " " + name;
  }
  // Not a device query here: that would start CUDA for every partrain command line.
  if (comm::backend_compiled_in("nccl"))
    backend_help += " (nccl: on CUDA device memory, so it needs a CUDA device)";
  allreduce->add_option("--backend", args->backends, backend_help)->required();
  allreduce->add_option("--world", args->world,
                        "Number of ranks (processes) in all; under an engine: its world");
  allreduce->add_option("--sizes", args->sizes, "Message sizes in bytes, e.g. 4K,1M,16M");
  allreduce->add_option("--dtype", args->dtype, "f32 | f64 | f16 | bf16 | i32 | i64");
  allreduce->add_option("--wire-dtype", args->wire_dtype,
                        "asio-ring wire format: f32 | f16 | bf16");
  allreduce->add_option("--iters", args->iters, "Timed iterations per size (default: by size)");
  allreduce->add_option("--warmup", args->warmup, "Untimed iterations per size");
  allreduce->add_option("--timeout-s", args->timeout_s, "Collective timeout in seconds");
  allreduce->add_option("--json", args->json_path, "Write the partrain.bench/1 report here");
  allreduce
      ->add_option("--nnodes", args->nnodes, "Hosts in the run; each starts world/nnodes ranks")
      ->check(CLI::Range(1, 1024));
  allreduce->add_option("--node-rank", args->node_rank, "This host's index, 0-based")
      ->check(CLI::Range(0, 1023));
  allreduce->add_option("--master-addr", args->master_addr, "Address of the host with rank 0");
  allreduce
      ->add_option("--master-port", args->master_port,
                   "Port of the rendezvous store on that host (0: pick one; one host only)")
      ->check(CLI::Range(0, 65535));
  allreduce->add_option("--host", args->host,
                        "Address this host's ranks listen on and advertise to the others "
                        "(default: as partrain run chooses it: loopback on one host, else the "
                        "route to the master or PARTRAIN_SOCKET_IFNAME's address)");
  allreduce->add_option("--rendezvous", args->rendezvous,
                        "Store url under mpirun/srun/torchrun (default: PARTRAIN_RENDEZVOUS, "
                        "MASTER_ADDR/MASTER_PORT, or Slurm's node list)");
  allreduce->callback([args, &exit_code] {
    const EngineRank me = read_engine_rank(process_environment(), args->rendezvous);
    // A one-rank engine (srun -n 1) may still start a local group, as nccl-tests' -g does.
    const bool is_rank = me.engine == Engine::partrain ||
                         (me.engine != Engine::none && (me.world_size > 1 || args->world <= 1));
    exit_code = is_rank ? run_as_rank(*args, me) : start_ranks(*args);
  });
}

}  // namespace partrain::cli
