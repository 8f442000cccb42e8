// defines: add_bench_command() — `partrain bench allreduce`: per message size the median
// time, algbw, busbw and a count of wrong elements of one collective (allreduce by default;
// --collective reduce_scatter, allgather or broadcast), for one or several backends in one
// run, each rank a separate process (nccl-tests is the model); each row names the algorithm
// the backend took, and for the peer transport's algorithms a latency/bandwidth fit per
// backend and algorithm follows the table.
//
// Two ways to get the ranks:
//   * started here: the launcher (cli/launcher.h, as partrain run uses it) starts --world
//     ranks as `partrain bench allreduce ...` processes on this host, or world / --nnodes on
//     each of several hosts given the same --nnodes --node-rank --master-addr --master-port
//     flags as partrain run. Rank 0 writes its results to PARTRAIN_BENCH_RESULTS; the
//     process that started it (node 0's) prints the table and writes --json.
//   * started by mpirun, srun or torchrun: each process is one rank, found and rendezvoused
//     as partrain worker does (cli/engine_env.h); rank 0 prints and writes --json.
// Each iteration refills the buffer, passes a barrier, times one collective and checks every
// element; an iteration's time is the slowest rank's. With --timing loop, after the checked
// warm-up, each sample times the iterations back to back instead and takes their mean (Note
// [Timing each collective or a loop]).
#include <CLI/CLI.hpp>

#include <cstring>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>

#include "cli/bench_memory.h"
#include "cli/commands.h"
#include "cli/engine_env.h"
#include "cli/launcher.h"
#include "cli/platform_process.h"
#include "comm_backends/algorithms/algorithm_choice.h"
#include "comm_backends/algorithms/peer_collectives.h"
#include "comm_backends/communicator.h"
#include "comm_backends/placement.h"
#include "comm_backends/rank_group.h"
#include "comm_backends/reduction.h"
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
  std::string collective = "allreduce";  // allreduce | reduce_scatter | allgather | broadcast
  std::string algorithm = "auto";        // comm.algorithm for asio-ring and hierarchical
  std::string tcp_congestion = "auto";   // comm.tcp_congestion for asio-ring and hierarchical
  std::string shm_single_copy = "on";    // comm.shm_single_copy for shm and hierarchical: on | off
  // auto: the ranks this command starts get cores of their own (or share CPUs evenly), as
  // launch.bind: auto binds them (not with nccl, whose buffers are on GPUs); none: the
  // scheduler places them.
  std::string bind = "auto";
  int world = 0;  // 0: not given
  std::string sizes = "4K,64K,1M,16M";
  std::string dtype = "f32";
  std::string wire_dtype = "f32";
  int iters = 0;  // 0: by size
  int warmup = 3;
  std::string timing = "each";  // each | loop
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

// Note [Timing each collective or a loop]
// `--timing each` (the default) times every collective alone, between a barrier and the check
// of its result, as the peer benchmarks (bench/peers/collectives) do by default: a latency, the
// slowest rank's. Where something outside the collective sets the pace, that untimed part
// enters the timed one. Behind a token bucket (the rate-limited links of
// bench/multinode/link.sh) the bucket refills while the ranks refill, check and meet, so a run
// whose untimed part is longer finds more credit and a shorter collective; two programs whose
// untimed parts differ cannot be compared at a saturated link this way. Where ranks share a
// CPU, what one rank does between collectives is time its neighbour waits. `--timing loop`
// checks the warm-up's results, then times kLoopSamples samples of the iterations back to
// back, each their mean, as nccl-tests times a collective: what a run of collectives costs
// where one follows another (a training step's buckets), no untimed part between them. The
// samples run on zeros, which an in-place sum leaves as they were, and the result of each is
// checked to be zeros still: the values the check needs
// would grow with every allreduce, to infinities, on which a sum of floats ran 2x slower (Open
// MPI's, 1 MiB at W=2).
constexpr int kLoopSamples = 3;

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
  PARTRAIN_CHECK(!expected.empty(), Error, "bench: no values to check against");
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
  json placement;  // placement_json()
  bool all_right = true;
};

// Where the ranks ran, as the layout exchange saw it: what an automatic choice went by (a host
// whose ranks share cores keeps small and medium allreduces off the ring, algorithm_choice.h).
json placement_json(const comm::HostLayout& layout) {
  return {{"hosts", layout.host_count()},
          {"host_ranks", layout.host_sizes},
          {"host_cpus", layout.host_cpus},
          {"shares_cores", layout.shares_cores()}};
}

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

comm::CollectiveKind parse_collective(const std::string& name) {
  for (auto kind : {comm::CollectiveKind::allreduce, comm::CollectiveKind::reduce_scatter,
                    comm::CollectiveKind::allgather, comm::CollectiveKind::broadcast}) {
    if (comm::collective_kind_name(kind) == name) return kind;
  }
  throw UsageError("bench: --collective '" + name +
                   "' is not one of allreduce, reduce_scatter, allgather, broadcast");
}

// The period `expected` turned to start at element `offset` of it.
std::vector<std::uint8_t> rotated(const std::vector<std::uint8_t>& period, std::size_t offset,
                                  std::size_t element_size) {
  const std::size_t at = (offset % (period.size() / element_size)) * element_size;
  std::vector<std::uint8_t> out(period.begin() + static_cast<std::ptrdiff_t>(at), period.end());
  out.insert(out.end(), period.begin(), period.begin() + static_cast<std::ptrdiff_t>(at));
  return out;
}

// One collective's buffers, fill and check. `bytes` is its size as nccl-tests counts it: the
// buffer (allreduce, broadcast), the input (reduce_scatter) or the output (allgather).
struct Collective {
  comm::CollectiveKind kind;
  int rank, world;
  comm::DType dtype;
  std::size_t elem, period;
  BenchMemory& in;
  BenchMemory& out;
  // The values a check compares with, made here and in prepare(), not on every iteration:
  // with ranks that share a CPU, what one does between its collectives delays its neighbour's,
  // and encoding W periods for each allgather's check cost the neighbour about 5 us a 4 KiB
  // allgather at W=4 on 2 CPUs. Rank r's values: r + 1 + (i mod P); their sum over the ranks
  // at i: W(W+1)/2 + W (i mod P).
  std::vector<std::vector<std::uint8_t>> values;  // rank -> its period
  std::vector<std::uint8_t> sums;
  std::vector<std::uint8_t> zeros;       // what --timing loop's samples end with
  std::vector<std::uint8_t> block_sums;  // this rank's block of the sums, at this size

  Collective(comm::CollectiveKind kind, int rank, int world, comm::DType dtype, std::size_t period,
             BenchMemory& in, BenchMemory& out)
      : kind(kind),
        rank(rank),
        world(world),
        dtype(dtype),
        elem(comm::dtype_size(dtype)),
        period(period),
        in(in),
        out(out),
        sums(encode_period(dtype, period, world * (world + 1) / 2.0, world)),
        zeros(period * elem, 0) {
    for (int r = 0; r < world; ++r) values.push_back(encode_period(dtype, period, r + 1, 1.0));
  }

  std::size_t count(std::size_t bytes) const { return bytes / elem; }
  std::size_t block(std::size_t bytes) const { return count(bytes) / world; }

  // Before the iterations of one size.
  void prepare(std::size_t bytes) {
    if (kind == comm::CollectiveKind::reduce_scatter) {
      block_sums = rotated(sums, static_cast<std::size_t>(rank) * block(bytes), elem);
    }
  }

  // The result, brought to host memory, and its size in bytes: the buffer (allreduce,
  // broadcast), this rank's block (reduce_scatter) or the whole output (allgather).
  std::pair<const std::uint8_t*, std::size_t> result(std::size_t bytes) {
    using K = comm::CollectiveKind;
    BenchMemory& where = kind == K::allreduce || kind == K::broadcast ? in : out;
    const std::size_t n = kind == K::reduce_scatter ? block(bytes) * elem : bytes;
    where.from_collective(n);
    return {where.host(), n};
  }

  // The elements of the result that are not zero, after collectives of zeros.
  std::int64_t nonzero(std::size_t bytes) {
    const auto [at, n] = result(bytes);
    return count_wrong(at, n, elem, zeros);
  }

  void zero(std::size_t bytes) {
    const std::size_t n = kind == comm::CollectiveKind::allgather ? bytes / world : bytes;
    std::memset(in.host(), 0, n);
    in.to_collective(n);
  }

  void fill(std::size_t bytes) {
    const std::size_t n = kind == comm::CollectiveKind::allgather ? bytes / world : bytes;
    partrain::cli::fill(in.host(), n, values[static_cast<std::size_t>(rank)]);
    in.to_collective(n);
  }

  void run(comm::Communicator& comm, std::size_t bytes) {
    using K = comm::CollectiveKind;
    switch (kind) {
      case K::allreduce:
        return comm.allreduce(in.buffer(count(bytes), dtype), comm::ReduceOp::sum);
      case K::broadcast:
        return comm.broadcast(in.buffer(count(bytes), dtype), 0);
      case K::reduce_scatter:
        return comm.reduce_scatter(in.buffer(count(bytes), dtype), out.buffer(block(bytes), dtype),
                                   comm::ReduceOp::sum);
      case K::allgather:
        return comm.allgather(in.buffer(block(bytes), dtype), out.buffer(count(bytes), dtype));
      default:
        return;
    }
  }

  std::int64_t wrong(std::size_t bytes) {
    using K = comm::CollectiveKind;
    const auto [at, n] = result(bytes);
    switch (kind) {
      case K::allreduce:
        return count_wrong(at, n, elem, sums);
      case K::broadcast:
        return count_wrong(at, n, elem, values[0]);
      case K::reduce_scatter:
        return count_wrong(at, n, elem, block_sums);
      case K::allgather: {
        const std::size_t per_rank = n / world;
        std::int64_t bad = 0;
        for (int r = 0; r < world; ++r) {
          bad +=
              count_wrong(at + r * per_rank, per_rank, elem, values[static_cast<std::size_t>(r)]);
        }
        return bad;
      }
      default:
        return 0;
    }
  }

  // busbw over algbw, as nccl-tests counts it.
  double bus_factor() const {
    using K = comm::CollectiveKind;
    if (kind == K::allreduce) return 2.0 * (world - 1) / world;
    if (kind == K::broadcast) return 1.0;
    return static_cast<double>(world - 1) / world;
  }
};

// What the peer transport's algorithm `name` counts for the model (algorithm_choice.h), when
// asio-ring ran one of them among `world` ranks; null for other backends.
json cost_terms_json(const std::string& backend, comm::CollectiveKind kind, const std::string& name,
                     std::size_t bytes, int world, std::size_t chunk_bytes) {
  if (backend != "asio-ring") return nullptr;
  for (auto a :
       {comm::Algorithm::ring, comm::Algorithm::recursive_doubling, comm::Algorithm::rabenseifner,
        comm::Algorithm::recursive_halving, comm::Algorithm::binomial_tree}) {
    if (comm::algorithm_name(a) != name) continue;
    const comm::CostTerms t = comm::cost_terms(kind, a, bytes, world, chunk_bytes);
    return {{"messages", t.messages},
            {"bytes_moved", t.bytes_moved},
            {"bytes_reduced", t.bytes_reduced}};
  }
  return nullptr;
}

RankResults run_rank(const BenchArgs& args, const EngineRank& me) {
  const comm::DType dtype = comm::parse_dtype(args.dtype);
  const comm::DType wire = comm::parse_dtype(args.wire_dtype);
  const comm::CollectiveKind kind = parse_collective(args.collective);
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
  RankResults out;
  // Learned first, by every rank: the communicators below copy what the group knows instead of
  // asking again, and the collectives after it keep rank 0 (and its store) up until every rank
  // has it.
  out.placement = placement_json(group->layout());

  std::vector<std::size_t> sizes;
  for (const auto& s : split(args.sizes)) sizes.push_back(parse_size(s));
  const std::size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  const int devices = cuda_devices();

  for (const auto& backend : split(args.backends)) {
    // NCCL reduces device memory only: its ranks get a device each, the others host memory.
    const bool on_device = backend == "nccl";
    const int device = on_device ? me.local_rank % devices : 0;
    const auto memory_kind = on_device ? comm::DeviceKind::cuda : comm::DeviceKind::cpu;
    BenchMemory input(max_bytes + 64, memory_kind, device);
    BenchMemory output(max_bytes + 64, memory_kind, device);
    comm::CommOptions options = group->comm_options();
    options.backend = backend;
    options.wire_dtype = wire;
    options.algorithm = args.algorithm;
    options.tcp_congestion = args.tcp_congestion;
    options.shm_single_copy = args.shm_single_copy == "on";
    options.device = memory_kind;
    options.device_index = device;
    auto comm = group->make_communicator(options);
    Collective c(kind, me.rank, me.world_size, dtype, pattern_period(narrow), input, output);
    for (std::size_t bytes : sizes) {
      c.prepare(bytes);
      const int iters = args.iters > 0 ? args.iters : iterations_for(bytes);
      std::vector<double> seconds;
      std::int64_t wrong = 0;
      std::string algorithm;
      // each: every iteration alone. loop: the warm-up (at least one iteration, checked), then
      // samples of `iters` back to back.
      const bool loop = args.timing == "loop";
      const int alone = loop ? std::max(1, args.warmup) : args.warmup + iters;
      for (int it = 0; it < alone; ++it) {
        c.fill(bytes);
        comm->barrier();
        const auto start = Clock::now();
        c.run(*comm, bytes);
        const auto stop = Clock::now();
        algorithm = comm->last_algorithm();
        wrong += c.wrong(bytes);
        if (!loop && it >= args.warmup)
          seconds.push_back(std::chrono::duration<double>(stop - start).count());
      }
      for (int sample = 0; loop && sample < kLoopSamples; ++sample) {
        c.zero(bytes);
        comm->barrier();
        const auto start = Clock::now();
        for (int it = 0; it < iters; ++it) c.run(*comm, bytes);
        const auto stop = Clock::now();
        seconds.push_back(std::chrono::duration<double>(stop - start).count() / iters);
        wrong += c.nonzero(bytes);  // zeros in, zeros out, through every collective of the loop
      }
      reduce_host_values(*comm, memory_kind, device, seconds.data(), seconds.size(),
                         comm::DType::f64, comm::ReduceOp::max);
      reduce_host_values(*comm, memory_kind, device, &wrong, 1, comm::DType::i64,
                         comm::ReduceOp::sum);
      std::sort(seconds.begin(), seconds.end());
      const double median = seconds[seconds.size() / 2];
      const double algbw = static_cast<double>(bytes) / median / 1e9;
      out.all_right &= wrong == 0;
      // What the peer transport's algorithms count: bytes as they travel (f16/bf16 data go as
      // f32 unless the wire is narrow too).
      const comm::DType work = comm::accumulator_type(dtype);
      const comm::DType travels =
          work == comm::DType::f32 && comm::dtype_size(wire) == 2 ? wire : work;
      const bool reduces =
          kind == comm::CollectiveKind::allreduce || kind == comm::CollectiveKind::reduce_scatter;
      const std::size_t wire_bytes =
          reduces ? bytes / comm::dtype_size(dtype) * comm::dtype_size(travels) : bytes;
      const std::size_t chunk =
          options.ring_chunk_bytes > 0 ? options.ring_chunk_bytes : comm::kDefaultRingChunkBytes;
      out.results.push_back(
          {{"backend", backend},
           {"algorithm", algorithm},
           {"bytes", bytes},
           {"iters", iters},
           {"timing", args.timing},
           {"median_us", median * 1e6},
           {"min_us", seconds.front() * 1e6},
           {"algbw_gbps", algbw},
           {"busbw_gbps", algbw * c.bus_factor()},
           {"wrong", wrong},
           {"terms", cost_terms_json(backend, kind, algorithm, wire_bytes, me.world_size, chunk)}});
    }
  }
  return out;
}

// ---- reporting ------------------------------------------------------------------------------

void print_table(const json& results, const BenchArgs& args, int world, const std::string& where,
                 const json& placement) {
  std::printf(
      "# partrain bench allreduce  collective=%s  world=%d  dtype=%s  wire=%s  sum, timing=%s, "
      "algorithm=%s, tcp congestion=%s, shm single copy=%s, %d processes, %s\n",
      args.collective.c_str(), world, args.dtype.c_str(), args.wire_dtype.c_str(),
      args.timing.c_str(), args.algorithm.c_str(), args.tcp_congestion.c_str(),
      args.shm_single_copy.c_str(), world, where.c_str());
  // "# hosts: 1 (4 ranks on 2 CPUs): ranks share cores, so ...", the first eight hosts.
  std::string hosts;
  const auto& ranks = placement["host_ranks"];
  const auto& cpus = placement["host_cpus"];
  for (std::size_t h = 0; h < ranks.size() && h < 8; ++h) {
    const int n = cpus[h].get<int>();
    hosts += (h == 0 ? "" : "; ") + std::to_string(ranks[h].get<int>()) + " ranks on " +
             (n > 0 ? std::to_string(n) : std::string("?")) + " CPUs";
  }
  if (ranks.size() > 8) hosts += "; ...";
  const std::string shared = ": ranks share cores, so an automatic allreduce below " +
                             human_size(comm::kSharedCoresRingFrom) + " skips the ring";
  std::printf("# hosts: %zu (%s)%s\n", placement["hosts"].get<std::size_t>(), hosts.c_str(),
              placement["shares_cores"].get<bool>() ? shared.c_str() : "");
  std::printf("%-12s %-18s %12s %9s %6s %12s %12s %12s %7s\n", "backend", "algorithm", "bytes",
              "size", "iters", "median_us", "algbw_GB/s", "busbw_GB/s", "wrong");
  for (const auto& r : results) {
    std::printf("%-12s %-18s %12zu %9s %6d %12.1f %12.3f %12.3f %7lld\n",
                r["backend"].get<std::string>().c_str(), r["algorithm"].get<std::string>().c_str(),
                r["bytes"].get<std::size_t>(), human_size(r["bytes"].get<std::size_t>()).c_str(),
                r["iters"].get<int>(), r["median_us"].get<double>(), r["algbw_gbps"].get<double>(),
                r["busbw_gbps"].get<double>(),
                static_cast<long long>(r["wrong"].get<std::int64_t>()));
  }
  std::fflush(stdout);
}

// Per backend and algorithm, over its sizes, the least-squares fit of the median time
// T = alpha * messages + beta * bytes_moved with the model's counts (algorithm_choice.h; beta
// takes in the reductions), or T = alpha + beta * bytes for an algorithm the model does not
// count (shm, Gloo's). Printed after the table and kept in the report as "fits".
json fit_models(const json& results) {
  std::map<std::pair<std::string, std::string>, std::vector<const json*>> groups;
  for (const auto& r : results) {
    groups[{r["backend"].get<std::string>(), r["algorithm"].get<std::string>()}].push_back(&r);
  }
  json fits = json::array();
  for (const auto& [key, rows] : groups) {
    if (rows.size() < 2) continue;
    // Normal equations of the two-parameter fit, weighted by 1/T so that every size counts
    // relatively (a 64 MiB time must not drown a 4 KiB one).
    double sxx = 0, sxy = 0, syy = 0, sxt = 0, syt = 0;
    const auto regressors = [](const json& r) {
      const json& t = r["terms"];
      if (t.is_null()) return std::pair{1.0, r["bytes"].get<double>()};
      return std::pair{t["messages"].get<double>(), t["bytes_moved"].get<double>()};
    };
    for (const json* r : rows) {
      const auto [x, y] = regressors(*r);
      const double t = (*r)["median_us"].get<double>() * 1e-6, w = 1.0 / (t * t);
      sxx += w * x * x;
      sxy += w * x * y;
      syy += w * y * y;
      sxt += w * x * t;
      syt += w * y * t;
    }
    const double det = sxx * syy - sxy * sxy;
    if (std::abs(det) < 1e-300) continue;
    const double alpha = (sxt * syy - syt * sxy) / det, beta = (syt * sxx - sxt * sxy) / det;
    double worst = 0;
    for (const json* r : rows) {
      const auto [x, y] = regressors(*r);
      const double t = (*r)["median_us"].get<double>() * 1e-6;
      worst = std::max(worst, std::abs(alpha * x + beta * y - t) / t);
    }
    fits.push_back({{"backend", key.first},
                    {"algorithm", key.second},
                    {"counted", !rows.front()->at("terms").is_null()},
                    {"alpha_us", alpha * 1e6},
                    {"beta_ns_per_byte", beta * 1e9},
                    {"sizes", rows.size()},
                    {"max_error", worst}});
  }
  return fits;
}

void print_fits(const json& fits) {
  for (const auto& f : fits) {
    std::printf(
        "# fit %-12s %-18s alpha %9.2f us %s beta %8.4f ns/B  (%zu sizes, off by %.0f%% "
        "at most)\n",
        f["backend"].get<std::string>().c_str(), f["algorithm"].get<std::string>().c_str(),
        f["alpha_us"].get<double>(), f["counted"].get<bool>() ? "per message" : "per call",
        f["beta_ns_per_byte"].get<double>(), f["sizes"].get<std::size_t>(),
        100 * f["max_error"].get<double>());
  }
  std::fflush(stdout);
}

// The table, the fits, the --json report, and exit code 1 when any element was wrong.
int report(const json& results, const json& placement, const BenchArgs& args, int world,
           const std::string& where) {
  print_table(results, args, world, where, placement);
  const json fits = fit_models(results);
  print_fits(fits);
  bool all_right = true;
  for (const auto& r : results) all_right &= r["wrong"].get<std::int64_t>() == 0;
  if (!args.json_path.empty()) {
    const json report = {{"schema", "partrain.bench/1"},
                         {"collective", args.collective},
                         {"algorithm", args.algorithm},
                         {"tcp_congestion", args.tcp_congestion},
                         {"shm_single_copy", args.shm_single_copy == "on"},
                         {"world", world},
                         {"dtype", args.dtype},
                         {"wire_dtype", args.wire_dtype},
                         {"results", results},
                         {"fits", fits},
                         {"placement", placement}};
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
  const comm::CollectiveKind kind = parse_collective(args.collective);
  comm::parse_algorithm_request(args.algorithm);
  const std::string congestion = comm::tcp_congestion_problem(args.tcp_congestion);
  PARTRAIN_CHECK(congestion.empty(), UsageError, "bench: --tcp-congestion ", congestion);
  const std::string timeout_problem = comm::timeout_seconds_problem(args.timeout_s);
  PARTRAIN_CHECK(timeout_problem.empty(), UsageError, "bench: --timeout-s ", timeout_problem);
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
    // reduce_scatter's input and allgather's output hold one block per rank.
    const std::size_t unit = comm::dtype_size(dtype) * static_cast<std::size_t>(world);
    PARTRAIN_CHECK(
        (kind != comm::CollectiveKind::reduce_scatter && kind != comm::CollectiveKind::allgather) ||
            bytes % unit == 0,
        UsageError, "bench: size ", s, " of ", args.collective, " is not a multiple of ", world,
        " ranks x the ", args.dtype, " element size");
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
    write_file_atomically(results_file,
                          json{{"results", mine.results}, {"placement", mine.placement}}.dump());
    return 0;  // the process that started us checks and reports
  }
  return report(mine.results, mine.placement, args, me.world_size,
                "started by " + engine_name(me.engine));
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
                      "--collective", args.collective,
                      "--algorithm",  args.algorithm,
                      "--world",      std::to_string(args.world),
                      "--sizes",      args.sizes,
                      "--dtype",      args.dtype,
                      "--wire-dtype", args.wire_dtype,
                      "--iters",      std::to_string(args.iters),
                      "--warmup",     std::to_string(args.warmup),
                      "--timing",     args.timing,
                      "--timeout-s",  std::to_string(args.timeout_s)};
  plan.worker_args.insert(plan.worker_args.end(), {"--tcp-congestion", args.tcp_congestion,
                                                   "--shm-single-copy", args.shm_single_copy});
  // What every node shares, for the run token: the address this host listens on is its own.
  for (const auto& arg : plan.worker_args) plan.run_identity += arg + '\n';
  if (!args.host.empty()) plan.worker_args.insert(plan.worker_args.end(), {"--host", args.host});
  plan.nodes = NodeLayout::per_node(std::vector<int>(args.nnodes, args.world / args.nnodes));
  plan.node_rank = args.node_rank;
  plan.master_addr = args.master_addr;
  plan.master_port = args.master_port;
  plan.extra_env[kResultsVariable] = results_path.string();
  const auto backends = split(args.backends);
  if (args.bind == "auto" &&
      std::find(backends.begin(), backends.end(), "nccl") == backends.end()) {
    plan.local_cpus = comm::bind_ranks(comm::allowed_cores(), plan.nodes.ranks_on(args.node_rank));
  }
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
  const json written = json::parse(in);
  const std::string where =
      (args.nnodes == 1 ? "one host" : std::to_string(args.nnodes) + " hosts") +
      (plan.local_cpus.empty()              ? ""
       : comm::shares_cpus(plan.local_cpus) ? ", ranks bound to CPUs they share evenly"
                                            : ", each rank on cores of its own");
  return report(written.at("results"), written.at("placement"), args, args.world, where);
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
  allreduce->add_option("--collective", args->collective,
                        "allreduce (default) | reduce_scatter | allgather | broadcast; a size "
                        "is the buffer, reduce_scatter's input or allgather's output");
  allreduce->add_option("--algorithm", args->algorithm,
                        "asio-ring and hierarchical (between hosts): auto (default: by size and "
                        "world) | ring | recursive_doubling | rabenseifner");
  allreduce->add_option("--tcp-congestion", args->tcp_congestion,
                        "asio-ring and hierarchical (between hosts): each connection's TCP "
                        "congestion control: auto (default: cubic, else reno, between ranks of "
                        "one machine; the system's between machines) | system | a name the "
                        "kernel has (cubic, reno, bbr)");
  allreduce
      ->add_option("--shm-single-copy", args->shm_single_copy,
                   "shm and hierarchical (inside a host): on (default: on Linux a large "
                   "allgather reads the other ranks' blocks straight from their processes, where "
                   "the system allows it) | off (through shared memory)")
      ->check(CLI::IsMember({"on", "off"}));
  allreduce
      ->add_option("--bind", args->bind,
                   "auto (default: each rank this command starts on cores of its own, or "
                   "sharing CPUs evenly where ranks outnumber them; Linux; not with nccl) | none")
      ->check(CLI::IsMember({"auto", "none"}));
  allreduce->add_option("--world", args->world,
                        "Number of ranks (processes) in all; under an engine: its world");
  allreduce->add_option("--sizes", args->sizes, "Message sizes in bytes, e.g. 4K,1M,16M");
  allreduce->add_option("--dtype", args->dtype, "f32 | f64 | f16 | bf16 | i32 | i64");
  allreduce->add_option("--wire-dtype", args->wire_dtype,
                        "asio-ring wire format: f32 | f16 | bf16");
  allreduce->add_option("--iters", args->iters,
                        "Timed iterations per size (default: by size; with --timing loop, per "
                        "sample)");
  allreduce->add_option("--warmup", args->warmup, "Untimed iterations per size");
  allreduce
      ->add_option("--timing", args->timing,
                   "each (default: every iteration refilled, after a barrier, timed alone and "
                   "checked) | loop (after the checked warm-up, 3 samples of the iterations back "
                   "to back, each their mean)")
      ->check(CLI::IsMember({"each", "loop"}));
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
