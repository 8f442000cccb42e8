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

#include "tests/comm/rank_process.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

RankProcess spawn_rank(const testing::ScratchDir& dir, int rank, int world,
                       const std::string& backend, int timeout_ms) {
  RankProcess p;
  p.log = dir.path() / ("stderr-" + std::to_string(rank));
  p.ready = dir.path() / ("ready-" + std::to_string(rank));
  const std::string store = "file://" + (dir.path() / "store").string();
  std::vector<std::string> args = {COMM_RANK_PROCESS,     store,   std::to_string(rank),
                                   std::to_string(world), backend, std::to_string(timeout_ms),
                                   p.ready.string()};
  p.pid = fork();
  if (p.pid == 0) {
    const int fd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return p;
}

// Starts `world` ranks, waits for them all to be running, then does `injure` to `victim`
// and checks that every other rank exits with a PeerError naming the victim in time.
void expect_victim_named(const std::string& backend, int world, int victim, int signal_number) {
  constexpr int kTimeoutMs = 1500;
  testing::ScratchDir dir;
  std::vector<RankProcess> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(spawn_rank(dir, r, world, backend, kTimeoutMs));
  // Survivors get 2x the timeout, plus a little for process exit.
  expect_survivors_name(ranks, victim, signal_number, milliseconds(2 * kTimeoutMs + 500));
}

TEST(ProcessFailure, KilledRankIsNamedByTheOthers) {
  expect_victim_named("asio-ring", 3, 1, SIGKILL);
}

TEST(ProcessFailure, FrozenRankIsNamedWithinTwiceTheTimeout) {
  expect_victim_named("asio-ring", 4, 2, SIGSTOP);
}

TEST(ProcessFailure, ShmKilledRankIsNamedByTheOthers) { expect_victim_named("shm", 3, 1, SIGKILL); }

TEST(ProcessFailure, ShmFrozenRankIsNamedWithinTwiceTheTimeout) {
  expect_victim_named("shm", 4, 2, SIGSTOP);
}

#ifdef PARTRAIN_WITH_GLOO
TEST(ProcessFailure, GlooKilledPeerIsNamed) { expect_victim_named("gloo", 2, 1, SIGKILL); }
// With more than two ranks Gloo's own error names an address, at times that of a survivor
// stuck on the dead rank; every survivor must still name the dead one.
TEST(ProcessFailure, GlooKilledPeerIsNamedInAWorldOfFour) {
  expect_victim_named("gloo", 4, 2, SIGKILL);
}
TEST(ProcessFailure, GlooFrozenPeerIsNamedInAWorldOfThree) {
  expect_victim_named("gloo", 3, 1, SIGSTOP);
}
#endif

}  // namespace
}  // namespace partrain::comm

#endif
