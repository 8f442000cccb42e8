// `partrain bench allreduce` end to end: real processes, a checked JSON report, usage errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/comm/rank_threads.h"

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
  testing::TempDir dir;
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
}

TEST(BenchCommand, BadUsageExitsTwoWithOneLine) {
  const std::string exe = partrain_exe();
  if (exe.empty()) GTEST_SKIP() << "PARTRAIN_EXE not set (run through ctest)";
  for (const std::string args :
       {"--backend asio-ring --world 2 --sizes 6", "--backend mpi --world 2 --sizes 4K",
        "--backend asio-ring --world 2 --sizes 4X", "--backend asio-ring --world 2 --dtype f8"}) {
    std::string output;
    EXPECT_EQ(run(exe + " bench allreduce " + args, output), 2) << args << ": " << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
}
#endif

}  // namespace
}  // namespace partrain::comm
