// defines: add_bench_command() — `partrain bench allreduce`: W ranks as separate processes on
// loopback, per message size the median time, algbw, busbw and a count of wrong elements,
// for one or several backends in one run (nccl-tests is the model).
//
// The command re-executes its own binary W times with hidden --rank/--store/--results
// arguments; the ranks rendezvous through a file store in a fresh temp directory, rank 0
// writes the results there, and this process prints them. Each iteration refills the buffer,
// passes a barrier, times one allreduce and checks every element; an iteration's time is the
// slowest rank's.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#ifdef _WIN32
#include <process.h>
#include <stdlib.h>
#else
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
extern char** environ;
#endif

#include "cli/commands.h"
#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string backends = "asio-ring";
  int world = 2;
  std::string sizes = "4K,64K,1M,16M";
  std::string dtype = "f32";
  std::string wire_dtype = "f32";
  int iters = 0;  // 0: by size
  int warmup = 3;
  double timeout_s = 120;
  std::string json_path;
  // Hidden: set when this process is one of the ranks.
  int rank = -1;
  std::string store;
  std::string results;
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

void run_rank(const BenchArgs& args) {
  const comm::DType dtype = comm::parse_dtype(args.dtype);
  const comm::DType wire = comm::parse_dtype(args.wire_dtype);
  const bool narrow = comm::dtype_size(dtype) == 2 || comm::dtype_size(wire) == 2;
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(args.timeout_s * 1000));
  comm::StoreOptions store_options;
  store_options.token = "bench";
  store_options.timeout = timeout;
  store_options.rank = args.rank;
  store_options.world_size = args.world;
  auto store = comm::open_store("file://" + args.store, store_options);

  std::vector<std::size_t> sizes;
  for (const auto& s : split(args.sizes)) sizes.push_back(parse_size(s));
  const std::size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<std::uint8_t> buffer(max_bytes + 64);
  json results = json::array();

  for (const auto& backend : split(args.backends)) {
    comm::CommOptions options;
    options.backend = backend;
    options.timeout = timeout;
    options.wire_dtype = wire;
    options.token = "bench";
    auto comm = comm::make_communicator(options, *store, args.rank, args.world);
    for (std::size_t bytes : sizes) {
      const std::size_t count = bytes / comm::dtype_size(dtype);
      const int iters = args.iters > 0 ? args.iters : iterations_for(bytes);
      std::vector<double> seconds;
      std::int64_t wrong = 0;
      const std::size_t period = pattern_period(narrow);
      const auto mine = encode_period(dtype, period, args.rank + 1, 1.0);
      const auto expected =
          encode_period(dtype, period, args.world * (args.world + 1) / 2.0, args.world);
      const std::size_t used = count * comm::dtype_size(dtype);
      for (int it = 0; it < args.warmup + iters; ++it) {
        fill(buffer.data(), used, mine);
        comm->barrier();
        const auto start = Clock::now();
        comm->allreduce(comm::Buffer{buffer.data(), count, dtype}, comm::ReduceOp::sum);
        const auto stop = Clock::now();
        wrong += count_wrong(buffer.data(), used, comm::dtype_size(dtype), expected);
        if (it >= args.warmup)
          seconds.push_back(std::chrono::duration<double>(stop - start).count());
      }
      comm->allreduce(comm::Buffer{seconds.data(), seconds.size(), comm::DType::f64},
                      comm::ReduceOp::max);
      comm->allreduce(comm::Buffer{&wrong, 1, comm::DType::i64}, comm::ReduceOp::sum);
      std::sort(seconds.begin(), seconds.end());
      const double median = seconds[seconds.size() / 2];
      const double algbw = static_cast<double>(bytes) / median / 1e9;
      results.push_back({{"backend", backend},
                         {"bytes", bytes},
                         {"iters", iters},
                         {"median_us", median * 1e6},
                         {"min_us", seconds.front() * 1e6},
                         {"algbw_gbps", algbw},
                         {"busbw_gbps", algbw * 2.0 * (args.world - 1) / args.world},
                         {"wrong", wrong}});
    }
  }
  if (args.rank == 0) {
    const std::string temp = args.results + ".tmp";
    std::ofstream(temp) << results.dump();
    fs::rename(temp, args.results);
  }
}

// ---- the launching side ---------------------------------------------------------------------

std::string own_executable() {
#ifdef _WIN32
  return _pgmptr;
#else
  return fs::read_symlink("/proc/self/exe").string();
#endif
}

class RankProcess {
 public:
  explicit RankProcess(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
#ifdef _WIN32
    handle_ = _spawnv(_P_NOWAIT, argv[0], argv.data());
    PARTRAIN_CHECK(handle_ != -1, Error, "bench: cannot start ", args[0]);
#else
    PARTRAIN_CHECK(posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) == 0, Error,
                   "bench: cannot start ", args[0]);
#endif
  }

  // -1 while running, else the exit code (128 + signal for a signal).
  int poll() {
    if (code_ >= 0) return code_;
#ifdef _WIN32
    // _cwait blocks; ranks are bounded by their own timeouts, so this ends.
    int code = 0;
    _cwait(&code, handle_, 0);
    code_ = code;
#else
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
#endif
    return code_;
  }

  void kill() {
#ifndef _WIN32
    if (code_ < 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      code_ = 128 + SIGKILL;
    }
#endif
  }

 private:
#ifdef _WIN32
  intptr_t handle_ = -1;
#else
  pid_t pid_ = -1;
#endif
  int code_ = -1;
};

void print_table(const json& results, const BenchArgs& args) {
  std::printf(
      "# partrain bench allreduce  world=%d  dtype=%s  wire=%s  sum, loopback, %d processes\n",
      args.world, args.dtype.c_str(), args.wire_dtype.c_str(), args.world);
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

int run_bench(const BenchArgs& args) {
  PARTRAIN_CHECK(args.world >= 1 && args.world <= 64, UsageError, "bench: --world must be 1..64");
  const comm::DType dtype = comm::parse_dtype(args.dtype);
  comm::parse_dtype(args.wire_dtype);
  PARTRAIN_CHECK(args.timeout_s > 0, UsageError, "bench: --timeout-s must be positive");
  const auto backends = split(args.backends);
  PARTRAIN_CHECK(!backends.empty(), UsageError, "bench: --backend names no backend");
  for (const auto& b : backends) {
    const auto names = comm::backend_names();
    PARTRAIN_CHECK(std::find(names.begin(), names.end(), b) != names.end(), UsageError,
                   "bench: unknown backend '", b, "'");
    PARTRAIN_CHECK(comm::backend_compiled_in(b), UsageError, "bench: backend '", b,
                   "' is not compiled into this build");
  }
  const auto sizes = split(args.sizes);
  PARTRAIN_CHECK(!sizes.empty(), UsageError, "bench: --sizes names no size");
  for (const auto& s : sizes) {
    const std::size_t bytes = parse_size(s);
    PARTRAIN_CHECK(bytes > 0 && bytes % comm::dtype_size(dtype) == 0, UsageError, "bench: size ", s,
                   " is not a positive multiple of the ", args.dtype, " element size");
  }

  std::random_device random;
  const fs::path dir = fs::temp_directory_path() /
                       ("partrain-bench-" + std::to_string(random()) + std::to_string(random()));
  fs::create_directories(dir);
  struct RemoveDir {
    fs::path path;
    ~RemoveDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_dir{dir};
  const fs::path results_path = dir / "results.json";

  std::vector<RankProcess> ranks;
  ranks.reserve(args.world);
  for (int r = 0; r < args.world; ++r) {
    std::vector<std::string> argv = {own_executable(),
                                     "bench",
                                     "allreduce",
                                     "--backend",
                                     args.backends,
                                     "--world",
                                     std::to_string(args.world),
                                     "--sizes",
                                     args.sizes,
                                     "--dtype",
                                     args.dtype,
                                     "--wire-dtype",
                                     args.wire_dtype,
                                     "--iters",
                                     std::to_string(args.iters),
                                     "--warmup",
                                     std::to_string(args.warmup),
                                     "--timeout-s",
                                     std::to_string(args.timeout_s),
                                     "--rank",
                                     std::to_string(r),
                                     "--store",
                                     (dir / "store").string(),
                                     "--results",
                                     results_path.string()};
    ranks.emplace_back(argv);
  }
  // Wait for all; once one fails, the others get one timeout to notice before being stopped.
  std::optional<Clock::time_point> stop_by;
  int failed_rank = -1, failed_code = 0;
  while (true) {
    bool running = false;
    for (int r = 0; r < args.world; ++r) {
      const int code = ranks[r].poll();
      if (code < 0)
        running = true;
      else if (code != 0 && failed_rank < 0) {
        failed_rank = r;
        failed_code = code;
        stop_by = Clock::now() +
                  std::chrono::milliseconds(static_cast<int>(args.timeout_s * 1000) + 5000);
      }
    }
    if (!running) break;
    if (stop_by && Clock::now() > *stop_by) {
      for (auto& rank : ranks) rank.kill();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  PARTRAIN_CHECK(failed_rank < 0, Error, "bench: rank ", failed_rank, " failed (exit code ",
                 failed_code, "); see its message above");
  std::ifstream in(results_path);
  PARTRAIN_CHECK(in.good(), Error, "bench: rank 0 wrote no results");
  const json results = json::parse(in);
  print_table(results, args);

  bool all_right = true;
  for (const auto& r : results) all_right &= r["wrong"].get<std::int64_t>() == 0;
  if (!args.json_path.empty()) {
    json report = {{"schema", "partrain.bench/1"},  {"collective", "allreduce"},
                   {"world", args.world},           {"dtype", args.dtype},
                   {"wire_dtype", args.wire_dtype}, {"results", results}};
    const std::string temp = args.json_path + ".tmp";
    {
      std::ofstream out(temp);
      PARTRAIN_CHECK(out.good(), UsageError, "bench: cannot write ", args.json_path);
      out << report.dump(2) << "\n";
    }
    fs::rename(temp, args.json_path);
  }
  PARTRAIN_CHECK(all_right, Error, "bench: some results were wrong (see the wrong column)");
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Collective benchmarks");
  bench->require_subcommand(1);
  auto* allreduce = bench->add_subcommand(
      "allreduce", "Time allreduce across W local processes: median, algbw, busbw, wrong");
  auto args = std::make_shared<BenchArgs>();
  allreduce
      ->add_option("--backend", args->backends, "Backends, comma-separated (gloo,asio-ring,nccl)")
      ->required();
  allreduce->add_option("--world", args->world, "Number of ranks (processes)")->required();
  allreduce->add_option("--sizes", args->sizes, "Message sizes in bytes, e.g. 4K,1M,16M");
  allreduce->add_option("--dtype", args->dtype, "f32 | f64 | f16 | bf16 | i32 | i64");
  allreduce->add_option("--wire-dtype", args->wire_dtype,
                        "asio-ring wire format: f32 | f16 | bf16");
  allreduce->add_option("--iters", args->iters, "Timed iterations per size (default: by size)");
  allreduce->add_option("--warmup", args->warmup, "Untimed iterations per size");
  allreduce->add_option("--timeout-s", args->timeout_s, "Collective timeout in seconds");
  allreduce->add_option("--json", args->json_path, "Write the partrain.bench/1 report here");
  allreduce->add_option("--rank", args->rank)->group("");
  allreduce->add_option("--store", args->store)->group("");
  allreduce->add_option("--results", args->results)->group("");
  allreduce->callback([args, &exit_code] {
    if (args->rank >= 0) {
      run_rank(*args);
      exit_code = 0;
    } else {
      exit_code = run_bench(*args);
    }
  });
}

}  // namespace partrain::cli
