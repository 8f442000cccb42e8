// Real processes for what only processes show: a rank killed, or frozen, mid-collective.
// The survivors must fail with an error naming that rank within twice the timeout.
#include <gtest/gtest.h>

#ifdef __unix__

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "tests/comm/rank_threads.h"

namespace partrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct RankProcess {
  pid_t pid = -1;
  std::string stderr_path;
  std::string ready_path;
  int status = -1;
  Clock::time_point exited;
};

RankProcess spawn_rank(const testing::TempDir& dir, int rank, int world, const std::string& backend,
                       int timeout_ms) {
  RankProcess p;
  p.stderr_path = (dir.path() / ("stderr-" + std::to_string(rank))).string();
  p.ready_path = (dir.path() / ("ready-" + std::to_string(rank))).string();
  const std::string store = "file://" + (dir.path() / "store").string();
  std::vector<std::string> args = {COMM_RANK_PROCESS,     store,   std::to_string(rank),
                                   std::to_string(world), backend, std::to_string(timeout_ms),
                                   p.ready_path};
  p.pid = fork();
  if (p.pid == 0) {
    const int fd = ::open(p.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return p;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Starts `world` ranks, waits for them all to be running, then does `injure` to `victim`
// and checks that every other rank exits with a PeerError naming the victim in time.
void expect_victim_named(const std::string& backend, int world, int victim, int signal_number) {
  constexpr int kTimeoutMs = 1500;
  testing::TempDir dir;
  std::vector<RankProcess> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(spawn_rank(dir, r, world, backend, kTimeoutMs));
  const auto ready_by = Clock::now() + std::chrono::seconds(30);
  for (auto& p : ranks) {
    while (!std::filesystem::exists(p.ready_path) && Clock::now() < ready_by) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  bool all_ready = true;
  for (auto& p : ranks) all_ready &= std::filesystem::exists(p.ready_path);

  const auto injured_at = Clock::now();
  ::kill(ranks[victim].pid, signal_number);
  // Survivors get 2x the timeout, plus a little for process exit, before we stop them.
  const auto bound = injured_at + milliseconds(2 * kTimeoutMs + 500);
  int running = world - 1;
  while (running > 0 && Clock::now() < bound + std::chrono::seconds(5)) {
    for (int r = 0; r < world; ++r) {
      if (r == victim || ranks[r].status != -1) continue;
      int status = 0;
      if (::waitpid(ranks[r].pid, &status, WNOHANG) == ranks[r].pid) {
        ranks[r].status = status;
        ranks[r].exited = Clock::now();
        --running;
      }
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  for (auto& p : ranks) {
    if (p.status == -1) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, nullptr, 0);
    }
  }
  ASSERT_TRUE(all_ready) << "ranks did not start: " << read_file(ranks[0].stderr_path);
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    const std::string err = read_file(ranks[r].stderr_path);
    ASSERT_NE(ranks[r].status, -1) << "rank " << r << " still running after 2x timeout + 5 s";
    EXPECT_TRUE(WIFEXITED(ranks[r].status) && WEXITSTATUS(ranks[r].status) == 3)
        << "rank " << r << " status " << ranks[r].status << ": " << err;
    EXPECT_NE(err.find("peer-error rank=" + std::to_string(victim) + ":"), std::string::npos)
        << "rank " << r << ": " << err;
    EXPECT_LE(ranks[r].exited - injured_at, milliseconds(2 * kTimeoutMs + 500))
        << "rank " << r << " took too long: " << err;
  }
}

TEST(ProcessFailure, KilledRankIsNamedByTheOthers) {
  expect_victim_named("asio-ring", 3, 1, SIGKILL);
}

TEST(ProcessFailure, FrozenRankIsNamedWithinTwiceTheTimeout) {
  expect_victim_named("asio-ring", 4, 2, SIGSTOP);
}

#ifdef PARTRAIN_WITH_GLOO
TEST(ProcessFailure, GlooKilledPeerIsNamed) { expect_victim_named("gloo", 2, 1, SIGKILL); }
#endif

}  // namespace
}  // namespace partrain::comm

#endif
