// `partrain bench allreduce` end to end: real processes, a checked JSON report, usage errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "comm_backends/placement.h"
#include "tests/support/cross_memory.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

#ifdef __unix__
// Runs a command line; returns its exit code, with stdout+stderr in `output`.
int run(const std::string& command, std::string& output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char chunk[4096];
  std::size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0) output.append(chunk, n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string partrain_exe() {
  const char* exe = std::getenv("PARTRAIN_EXE");
  return exe != nullptr && std::filesystem::exists(exe) ? exe : std::string();
}

TEST(BenchCommand, WritesACheckedReport) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  testing::ScratchDir dir;
  const std::string json_path = (dir.path() / "bench.json").string();
  std::string output;
  const int code = run(exe +
                           " bench allreduce --backend asio-ring --world 3 --sizes 4K,100K"
                           " --dtype f32 --wire-dtype bf16 --iters 3 --json " +
                           json_path,
                       output);
  ASSERT_EQ(code, 0) << output;
  EXPECT_NE(output.find("busbw_GB/s"), std::string::npos) << output;
  std::ifstream in(json_path);
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report["schema"], "partrain.bench/1");
  EXPECT_EQ(report["collective"], "allreduce");
  EXPECT_EQ(report["world"], 3);
  EXPECT_EQ(report["dtype"], "f32");
  ASSERT_EQ(report["results"].size(), 2u);
  for (const auto& r : report["results"]) {
    EXPECT_EQ(r["backend"], "asio-ring");
    EXPECT_EQ(r["wrong"], 0);
    EXPECT_GT(r["median_us"].get<double>(), 0.0);
    EXPECT_NEAR(r["busbw_gbps"].get<double>(), r["algbw_gbps"].get<double>() * 4.0 / 3.0, 1e-9);
  }
  EXPECT_EQ(report["results"][1]["bytes"], 100 * 1024);
  // Where the ranks ran, as the choice saw it: one host, its three ranks and its CPUs.
  const auto& placement = report["placement"];
  EXPECT_EQ(placement["hosts"], 1);
  EXPECT_EQ(placement["host_ranks"], nlohmann::json::array({3}));
  const int cpus = placement["host_cpus"][0].get<int>();
  EXPECT_EQ(placement["shares_cores"].get<bool>(), cpus > 0 && cpus < 3) << placement.dump();
  EXPECT_NE(output.find("# hosts: 1 (3 ranks on "), std::string::npos) << output;
}

// Each collective is timed and checked; the rows name the algorithm that carried it (forced
// here), with the model's counts for the fit printed after the table.
TEST(BenchCommand, TimesAndChecksEachCollective) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  testing::ScratchDir dir;
  const std::pair<const char*, const char*> runs[] = {{"reduce_scatter", "recursive_halving"},
                                                      {"allgather", "recursive_doubling"},
                                                      {"broadcast", "binomial_tree"}};
  for (const auto& [collective, algorithm] : runs) {
    const std::string json_path = (dir.path() / (std::string(collective) + ".json")).string();
    std::string output;
    const int code =
        run(exe + " bench allreduce --backend asio-ring --world 3 --collective " + collective +
                " --algorithm recursive_doubling --sizes 12K,96K --iters 3 --json " + json_path,
            output);
    ASSERT_EQ(code, 0) << output;
    EXPECT_NE(output.find("# fit asio-ring"), std::string::npos) << output;
    std::ifstream in(json_path);
    const auto report = nlohmann::json::parse(in);
    EXPECT_EQ(report["collective"], collective);
    EXPECT_EQ(report["algorithm"], "recursive_doubling");
    ASSERT_EQ(report["results"].size(), 2u);
    for (const auto& r : report["results"]) {
      EXPECT_EQ(r["algorithm"], algorithm) << collective;
      EXPECT_EQ(r["wrong"], 0) << collective;
      EXPECT_GT(r["terms"]["messages"].get<double>(), 0.0) << collective;
    }
    ASSERT_EQ(report["fits"].size(), 1u) << output;
  }
  // A reduce_scatter's input holds one block per rank.
  std::string output;
  EXPECT_EQ(run(exe + " bench allreduce --backend asio-ring --world 3 --collective "
                      "reduce_scatter --sizes 4K",
                output),
            2)
      << output;
}

// --timing loop checks the warm-up and then times the iterations back to back: every
// collective, integers too (the samples run on zeros), with rows that say so and no wrong
// element; without a warm-up it still checks one iteration.
TEST(BenchCommand, LoopTimingChecksTheWarmUpAndTimesBackToBack) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  testing::ScratchDir dir;
  for (const std::string collective : {"allreduce", "reduce_scatter", "allgather", "broadcast"}) {
    const std::string json_path = (dir.path() / (collective + ".json")).string();
    std::string output;
    ASSERT_EQ(run(exe + " bench allreduce --backend shm,asio-ring --world 2 --collective " +
                      collective + " --dtype i32 --sizes 4K,96K --iters 20 --warmup 0 " +
                      "--timing loop --json " + json_path,
                  output),
              0)
        << output;
    EXPECT_NE(output.find("timing=loop"), std::string::npos) << output;
    std::ifstream in(json_path);
    const auto report = nlohmann::json::parse(in);
    ASSERT_EQ(report["results"].size(), 4u) << collective;
    for (const auto& r : report["results"]) {
      EXPECT_EQ(r["timing"], "loop") << collective;
      EXPECT_EQ(r["iters"], 20) << collective;
      EXPECT_EQ(r["wrong"], 0) << collective;
      EXPECT_GT(r["median_us"].get<double>(), 0.0) << collective;
    }
  }
}

// Two rank processes on cores of their own read each other's allgather blocks from 128 KiB
// straight from the other process (the rows name single_copy), and every element checks out;
// smaller blocks, and every block with --shm-single-copy off, go through the slots.
TEST(BenchCommand, ShmAllgatherReadsLargeBlocksFromTheOtherProcess) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
#if !defined(__linux__)
  GTEST_SKIP() << "cross-memory reads are Linux's";
#else
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) < 2) {
    GTEST_SKIP() << "fewer than two CPUs: the ranks would share one, and take the slots";
  }
  if (!testing::siblings_may_read_each_other()) GTEST_SKIP() << "ranks may not read each other";
  testing::ScratchDir dir;
  for (const std::string single_copy : {"on", "off"}) {
    const std::string json_path = (dir.path() / (single_copy + ".json")).string();
    std::string output;
    ASSERT_EQ(run(exe + " bench allreduce --backend shm --world 2 --collective allgather " +
                      "--sizes 64K,1M,3M --iters 4 --shm-single-copy " + single_copy + " --json " +
                      json_path,
                  output),
              0)
        << output;
    std::ifstream in(json_path);
    const auto report = nlohmann::json::parse(in);
    EXPECT_EQ(report["shm_single_copy"], single_copy == "on");
    ASSERT_EQ(report["results"].size(), 3u) << output;
    for (std::size_t i = 0; i < 3; ++i) {
      const auto& r = report["results"][i];
      EXPECT_EQ(r["algorithm"], i > 0 && single_copy == "on" ? "single_copy" : "shared_memory")
          << r["bytes"] << " " << single_copy;
      EXPECT_EQ(r["wrong"], 0) << r["bytes"];
    }
  }
#endif
}

TEST(BenchCommand, BadUsageExitsTwoWithOneLine) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  for (const std::string args :
       {"--backend asio-ring --world 2 --sizes 6", "--backend mpi --world 2 --sizes 4K",
        "--backend asio-ring --world 2 --sizes 4X", "--backend asio-ring --world 2 --dtype f8",
        "--backend asio-ring --world 2 --collective alltoall",
        "--backend asio-ring --world 2 --algorithm bcube",
        "--backend asio-ring --world 2 --tcp-congestion 'bbr!'",
        "--backend shm --world 2 --bind cores", "--backend shm --world 2 --timing always",
        // A timeout a wait would never reach (the config's range, 0.1 s to a week).
        "--backend asio-ring --world 2 --timeout-s 1e9",
        "--backend asio-ring --world 2 --timeout-s 0.01",
        "--backend asio-ring --world 2 --timeout-s nan"}) {
    std::string output;
    EXPECT_EQ(run(exe + " bench allreduce " + args, output), 2) << args << ": " << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}

// With /dev/shm too small for the shared region (1 MiB, in a mount namespace of the test's own),
// `auto` takes asio-ring and says why not shm; shm named anyway stops the run at setup with a
// line that says so and what to do, not with a SIGBUS in the middle of a collective, on any
// kernel (rank 0 reserves the region's pages; Linux 5.14 and later also map them all).
TEST(BenchCommand, ShmRegionThatDoesNotFitInDevShmIsNamedAtSetup) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  if (::geteuid() != 0) GTEST_SKIP() << "a mount namespace needs root";
  std::string output;
  const int code = run(
      "unshare -m sh -c 'mount -t tmpfs -o size=1m partrain-test-shm /dev/shm "
      "|| { echo cannot-mount; exit 77; }; " +
          exe + " version && exec " + exe + " bench allreduce --backend shm --world 2 --sizes 4K'",
      output);
  if (output.find("cannot-mount") != std::string::npos || code == 77) {
    GTEST_SKIP() << "cannot mount a tmpfs in a mount namespace here: " << output;
  }
  EXPECT_NE(output.find("auto: asio-ring"), std::string::npos) << output;
  EXPECT_NE(output.find("shm: compiled in, not usable here: the shared region of 4 MiB for 2 "
                        "ranks does not fit in /dev/shm (1 MiB free"),
            std::string::npos)
      << output;
  EXPECT_NE(code, 0) << output;
  EXPECT_NE(output.find("shm: the shared region of 4 MiB does not fit in /dev/shm"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("--shm-size"), std::string::npos) << output;
  EXPECT_EQ(output.find("SIGBUS"), std::string::npos) << output;
}

// The ranks the bench starts get cores of their own where there are as many CPUs as ranks, and
// share them evenly where there are not (Note [Binding ranks to cores] in placement.cpp), and
// the header says which; --bind none leaves them to the scheduler. This checks the plan the
// bench makes; that the launcher applies it is LauncherTest.RanksRunOnTheCpusOfThePlan's.
TEST(BenchCommand, StartedRanksAreBoundToCoresOfTheirOwn) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  const std::string own = "one host, each rank on cores of its own\n";
  const std::string shared = "one host, ranks bound to CPUs they share evenly\n";
  for (const int world : {2, 3}) {
    const auto plan = bind_ranks(allowed_cores(), world);
    for (const std::string bind : {"auto", "none"}) {
      std::string output;
      ASSERT_EQ(run(exe + " bench allreduce --backend shm --world " + std::to_string(world) +
                        " --sizes 4K --iters 2 --bind " + bind,
                    output),
                0)
          << output;
      const bool says_own = output.find(own) != std::string::npos;
      const bool says_shared = output.find(shared) != std::string::npos;
      const bool bound = bind == "auto" && !plan.empty();
      EXPECT_EQ(says_own, bound && !shares_cpus(plan)) << world << " " << bind << ": " << output;
      EXPECT_EQ(says_shared, bound && shares_cpus(plan)) << world << " " << bind << ": " << output;
    }
  }
}

// Exits 2 with one line instead of leaving a temp file beside a report it could not write.
TEST(BenchCommand, ReportIsWrittenAtomicallyOrNotAtAll) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  testing::ScratchDir dir;
  const auto target = dir.path() / "report";  // a non-empty directory: the rename must fail
  std::filesystem::create_directories(target / "inside");
  std::string output;
  const int code = run(exe +
                           " bench allreduce --backend asio-ring --world 2 --sizes 4K --iters 2"
                           " --json " +
                           target.string(),
                       output);
  EXPECT_EQ(code, 2) << output;
  std::istringstream lines(output);
  int errors = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("partrain:", 0) != 0) continue;
    ++errors;
    EXPECT_NE(line.find(target.string()), std::string::npos) << line;
  }
  EXPECT_EQ(errors, 1) << output;
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"report"}) << "a temp file was left behind";
}

// nccl reduces device memory only: without a CUDA device the bench says so before starting
// any rank (exit 2, one line), instead of each rank failing on host memory.
TEST(BenchCommand, NcclWithoutACudaDeviceIsRefused) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  std::string version;
  run(exe + " version", version);
  if (version.find("cuda: not available") == std::string::npos)
    GTEST_SKIP() << "this machine has a CUDA device";
  std::string output;
  EXPECT_EQ(run(exe + " bench allreduce --backend asio-ring,nccl --world 2 --sizes 4K", output), 2)
      << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  const bool compiled_in = version.find("  nccl: compiled in") != std::string::npos;
  EXPECT_NE(output.find(compiled_in ? "needs a CUDA device" : "not compiled"), std::string::npos)
      << output;
}

// Live (not zombie) processes whose real user is `uid`, from /proc.
std::vector<int> live_processes_of(int uid) {
  std::vector<int> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream status(entry.path() / "status");
    std::string line, state;
    int real_uid = -1;
    while (std::getline(status, line)) {
      if (line.rfind("State:", 0) == 0) state = line.substr(6);
      if (line.rfind("Uid:", 0) == 0) std::istringstream(line.substr(4)) >> real_uid;
    }
    if (real_uid == uid && state.find('Z') == std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

// A rank that cannot be started (here: the user's process limit is reached) stops the ranks
// started before it. The bench runs as a user of its own under RLIMIT_NPROC, raised one by
// one, so that some run starts the first ranks and then cannot start the next.
TEST(BenchCommand, StopsStartedRanksWhenALaterOneCannotStart) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the bench as a user of its own";
  if (std::system("command -v setpriv > /dev/null && command -v prlimit > /dev/null") != 0)
    GTEST_SKIP() << "needs setpriv and prlimit (util-linux)";
  const int uid = 54000 + static_cast<int>(::getpid() % 1000);
  testing::ScratchDir dir;
  const auto log = dir.path() / "bench.log";
  bool saw_partial_start = false;
  for (int limit = 2; limit <= 8 && !saw_partial_start; ++limit) {
    // Output to a file, not a pipe: ranks left behind would hold a pipe open and make this
    // wait for them.
    const std::string command =
        "setpriv --reuid=" + std::to_string(uid) + " --regid=" + std::to_string(uid) +
        " --clear-groups prlimit --nproc=" + std::to_string(limit) + " " + exe +
        " bench allreduce --backend asio-ring --world 4 --sizes 4K"
        " --iters 2 --timeout-s 60 > " +
        log.string() + " 2>&1";
    const int status = std::system(command.c_str());
    std::ifstream in(log);
    const std::string output((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;  // the limit allowed every rank
    saw_partial_start = output.find("stopped rank") != std::string::npos;
    // The bench has returned: whatever it started must be gone already (a short bound for
    // the kernel to finish reaping).
    std::vector<int> left = live_processes_of(uid);
    for (int i = 0; i < 50 && !left.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      left = live_processes_of(uid);
    }
    EXPECT_TRUE(left.empty()) << left.size() << " ranks still running with limit " << limit << ":\n"
                              << output;
    for (const int pid : left) ::kill(pid, SIGKILL);
  }
  EXPECT_TRUE(saw_partial_start) << "no process limit started some ranks but not all";
}

nlohmann::json rendezvous_report(const std::string& exe, int world, const testing::ScratchDir& dir,
                                 const std::string& more = "") {
  const std::string json_path =
      (dir.path() / ("rdzv" + std::to_string(world) + more + ".json")).string();
  std::string output;
  const int code = run(exe + " bench rendezvous --world " + std::to_string(world) +
                           " --timeout-s 60 --json " + json_path + " " + more,
                       output);
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find("store_ops"), std::string::npos) << output;
  std::ifstream in(json_path);
  return nlohmann::json::parse(in, nullptr, false);
}

// The ranks do what a joining rank does, and the store requests per rank stay the same when
// the world grows: a rendezvous that read every rank's value on every rank would cost four
// times the requests per rank at four times the world.
TEST(BenchRendezvous, StoreRequestsGrowLinearlyWithTheWorld) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  testing::ScratchDir dir;
  std::vector<double> per_rank;
  for (const int world : {32, 128}) {
    const nlohmann::json report = rendezvous_report(exe, world, dir);
    ASSERT_FALSE(report.is_discarded()) << "no JSON report for world " << world;
    EXPECT_EQ(report["schema"], "partrain.bench.rendezvous/1");
    EXPECT_EQ(report["world"], world);
    EXPECT_EQ(report["store"], "tcp");
    const double seconds = report["seconds"].get<double>();
    EXPECT_GT(seconds, 0.0);
    // Each rank passes the steps in order, so the last rank past each is later each time.
    double before = 0.0;
    for (const char* phase : {"connect", "config", "layout", "numbering", "addresses", "clocks"}) {
      ASSERT_TRUE(report["phases"].contains(phase)) << phase;
      const double at = report["phases"][phase].get<double>();
      EXPECT_GE(at, before) << phase;
      before = at;
    }
    EXPECT_DOUBLE_EQ(before, seconds);
    const auto ops = report["store_ops"].get<std::int64_t>();
    // About 11 a rank: config 5 (rank 0's hash; a barrier's set, add and wait; the check),
    // layout 2, numbering 1, addresses 2, clocks 1 (the server's clock is this host's, read
    // without a request; rank 0 publishes its offset, the others read it). The process mark
    // each rank sets as it joins rides in its hello: no request.
    EXPECT_GE(ops, 10 * world) << "fewer requests than the steps need";
    EXPECT_LE(ops, 12 * world);
    per_rank.push_back(static_cast<double>(ops) / world);
    // On one host every rank's clock is the server's: the estimate is exact.
    EXPECT_EQ(report["clock_estimate"]["error_us_max"].get<double>(), 0.0);
  }
  EXPECT_LT(per_rank[1], per_rank[0] + 0.5) << per_rank[0] << " then " << per_rank[1];

  // Read through round trips, as by ranks on other hosts: the 8 readings of the estimate
  // count the 10 answers each rank had before, so no more requests; every estimate is within
  // its bound.
  const nlohmann::json remote = rendezvous_report(exe, 32, dir, "--remote-clock");
  ASSERT_FALSE(remote.is_discarded());
  const auto ops = remote["store_ops"].get<std::int64_t>();
  EXPECT_GE(ops, 10 * 32);
  EXPECT_LE(ops, 12 * 32);
  EXPECT_LE(remote["clock_estimate"]["error_us_max"].get<double>(),
            remote["clock_estimate"]["bound_us_max"].get<double>() + 1.0);
}

TEST(BenchRendezvous, AWorldPastTheOpenFileLimitIsRefusedInOneLine) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  std::string output;
  // Lowering the hard limit needs no privilege; the bench cannot raise it back.
  EXPECT_EQ(run("ulimit -n 256 && " + exe + " bench rendezvous --world 1000", output), 2) << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  EXPECT_NE(output.find("hard limit 256"), std::string::npos) << output;
  for (const std::string args :
       {"--world 0", "--world 4 --timeout-s 0", "--world 4 --timeout-s 1e9", "--world many"}) {
    output.clear();
    EXPECT_EQ(run(exe + " bench rendezvous " + args, output), 2) << args << ": " << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}
#endif

}  // namespace
}  // namespace partrain::comm
