// defines: the harness for tests that run the built partrain executable: scratch
// directories, running it to completion or in the background, reading its reports, and
// finding (to kill) the worker of a given rank.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

namespace partrain_test {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// An environment variable for the runs started while it lives.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

inline std::string exe() {
  const char* e = std::getenv("PARTRAIN_EXE");
  return e ? e : PARTRAIN_EXE_DEFAULT;
}

// This test process's scratch directories all live under one root.
inline fs::path scratch_root() {
  return fs::temp_directory_path() / ("partrain_run_test_" + std::to_string(::getpid()));
}

inline fs::path scratch(const std::string& name) {
  fs::path dir = scratch_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Removes the scratch root once every test of the process has passed. After a failure it
// stays, so the logs that the failure message names can still be read.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    if (::testing::UnitTest::GetInstance()->failed_test_count() > 0) return;
    std::error_code ignored;
    fs::remove_all(scratch_root(), ignored);
  }
};
inline ::testing::Environment* const kScratchCleanup =
    ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

struct Result {
  int code = -1;
  std::string output;
};

// Runs `partrain ARGS` under `timeout`, output (stdout+stderr) captured.
inline Result partrain(const std::string& args, const fs::path& dir, int timeout_s = 240) {
  fs::path log = dir / "output.txt";
  std::string cmd = "timeout -k 5 " + std::to_string(timeout_s) + " " + exe() + " " + args + " > " +
                    log.string() + " 2>&1";
  int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

// A small synthetic run; `body` adds the keys the base does not set (a key set twice is a
// config error); tests change base keys with --set.
inline fs::path write_config(const fs::path& dir, const std::string& body) {
  fs::path path = dir / "config.yaml";
  std::ofstream(path) << "name: test\nseed: 1\ndevice: cpu\n"
                      << "data: {dataset: synthetic, synthetic_train: 1200, synthetic_test: 400, "
                         "batch_size: 32, num_workers: 1}\n"
                      << "model: {name: digitalnet, width: 8, norm: batch}\n"
                      << "comm: {timeout_s: 30}\n"
                      << "checkpoint: {every_epochs: 1, keep: 2, resume: never}\n"
                      << "output: {dir: " << (dir / "out").string() << "}\n"
                      << body;
  return path;
}

inline Json read_report(const fs::path& dir) {
  std::ifstream in(dir / "out" / "report.json");
  EXPECT_TRUE(in.good()) << "no report in " << dir;
  return Json::parse(in);
}

inline std::vector<double> epoch_losses(const fs::path& dir) {
  std::vector<double> losses;
  Json report = read_report(dir);  // kept alive: iterating a member of a temporary dangles
  for (const auto& e : report["epochs"]) losses.push_back(e["train_loss"].get<double>());
  return losses;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Starts `partrain ARGS...` in the background, stdout and stderr into `log`.
inline pid_t start_partrain(const std::vector<std::string>& args, const fs::path& log) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* out = freopen(log.c_str(), "w", stdout);
    (void)out;
    dup2(fileno(stdout), fileno(stderr));
    std::vector<char*> argv;
    std::string program = exe();
    argv.push_back(program.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Waits (bounded) until `log` contains `text` `count` times.
inline bool wait_for_text(const fs::path& log, const std::string& text, std::chrono::seconds bound,
                          int count = 1) {
  auto deadline = Clock::now() + bound;
  for (;;) {
    std::string t = read_text(log);
    int seen = 0;
    for (auto pos = t.find(text); pos != std::string::npos; pos = t.find(text, pos + 1)) ++seen;
    if (seen >= count) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The child of `parent` whose environment has RANK=<rank>, or 0.
inline pid_t find_worker(pid_t parent, int rank) {
  const std::string wanted = "RANK=" + std::to_string(rank);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::ifstream stat(entry.path() / "stat");
    std::string pid, comm, state;
    pid_t ppid = 0;
    if (!(stat >> pid >> comm >> state >> ppid) || ppid != parent) continue;
    std::ifstream environ(entry.path() / "environ");
    std::string var;
    while (std::getline(environ, var, '\0')) {
      if (var == wanted) return std::stoi(pid);
    }
  }
  return 0;
}

// Waits up to `bound` for `pid` to exit; returns its wait status, or nothing (then it was
// killed here, so no test leaves a process behind).
inline std::optional<int> wait_exit(pid_t pid, std::chrono::seconds bound) {
  auto deadline = Clock::now() + bound;
  int status = 0;
  while (Clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return std::nullopt;
}

// A port nothing listens on now (bound, read back and closed: a test's store takes it next).
// It is drawn below the kernel's ephemeral range, so that no outgoing connection or listener on
// port 0 of a test running beside this one can take it before the store binds it; the draw tries
// at most 200 ports, then falls back to one the kernel picks.
inline int unused_port() {
  int ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> ephemeral_low;
  const auto bindable = [](int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return bound ? static_cast<int>(ntohs(addr.sin_port)) : 0;
  };
  const int high = ephemeral_low - 1, low = std::max(1024, ephemeral_low - 20000);
  if (high > low) {
    std::mt19937 draw(std::random_device{}());
    std::uniform_int_distribution<int> pick(low, high);
    for (int attempt = 0; attempt < 200; ++attempt)
      if (const int port = bindable(pick(draw)); port != 0) return port;
  }
  const int port = bindable(0);
  EXPECT_NE(port, 0) << "no free port on 127.0.0.1";
  return port;
}

// Ranks as an engine starts them (RANK, WORLD_SIZE, a rendezvous), each reading `cfg` with the
// settings `odd_sets` given to rank `odd` alone; logs go to DIR/NAME-R.txt. Each rank's exit code
// and output, and the seconds until the last ended (bounded at 120 s).
struct EngineRanks {
  std::vector<std::pair<int, std::string>> ranks;  // exit code (-1: none), output
  double seconds = 0;
};
inline EngineRanks run_engine_ranks(const fs::path& dir, const fs::path& cfg,
                                    const std::string& name, const std::string& rendezvous,
                                    int world, int odd, const std::string& odd_sets) {
  std::string cmd;
  for (int rank = 0; rank < world; ++rank) {
    const fs::path log = dir / (name + "-" + std::to_string(rank) + ".txt");
    cmd += "(RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
           " PARTRAIN_RENDEZVOUS=" + rendezvous + " " + exe() + " worker " + cfg.string() +
           " --set comm.timeout_s=60 --set output.dir=" + (dir / (name + "-out")).string() +
           (rank == odd ? odd_sets : "") + " > " + log.string() + " 2>&1; echo $? > " +
           log.string() + ".code) & ";
  }
  const auto start = Clock::now();
  EXPECT_EQ(std::system(("timeout 120 bash -c '" + cmd + "wait'").c_str()), 0);
  EngineRanks out;
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int rank = 0; rank < world; ++rank) {
    const fs::path log = dir / (name + "-" + std::to_string(rank) + ".txt");
    const std::string code = read_text(fs::path(log.string() + ".code"));
    out.ranks.emplace_back(code.empty() ? -1 : std::stoi(code), read_text(log));
  }
  return out;
}

}  // namespace partrain_test
