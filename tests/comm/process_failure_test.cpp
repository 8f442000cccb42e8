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

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "comm_backends/store/tcp_store.h"
#include "common/errors.h"
#include "tests/comm/rank_process.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A rank of a run whose store is `store` (empty: a file store in `dir`).
RankProcess spawn_rank(const testing::ScratchDir& dir, int rank, int world,
                       const std::string& backend, int timeout_ms, std::string store = "") {
  RankProcess p;
  p.log = dir.path() / ("stderr-" + std::to_string(rank));
  p.ready = dir.path() / ("ready-" + std::to_string(rank));
  if (store.empty()) store = "file://" + (dir.path() / "store").string();
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

// Rank 0 serving the run's tcp store, as under torchrun, mpirun or srun, is killed or frozen:
// its store goes or freezes with it, so its published mark cannot be read. What its server
// said of its process at each rank's hello stands in: the others still say what it shows.
void expect_store_serving_rank_0_named(int signal_number, const std::string& seen) {
  constexpr int kTimeoutMs = 1500;
  constexpr int kWorld = 3;
  testing::ScratchDir dir;
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor probe(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  const std::string store = "tcp://127.0.0.1:" + std::to_string(probe.local_endpoint().port());
  probe.close();  // rank 0 listens there; the others retry until it does
  std::vector<RankProcess> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.push_back(spawn_rank(dir, r, kWorld, "asio-ring", kTimeoutMs, store));
  }
  // A frozen store costs the others' failure paths its grace on top of the timeout.
  expect_survivors_name(ranks, 0, signal_number, milliseconds(4 * kTimeoutMs), seen);
}

TEST(ProcessFailure, KilledRankServingTheStoreIsNamedAsExited) {
  expect_store_serving_rank_0_named(SIGKILL, "has exited, and the store it served with it");
}

TEST(ProcessFailure, FrozenRankServingTheStoreIsNamedAsStopped) {
  expect_store_serving_rank_0_named(SIGSTOP, "is stopped (SIGSTOP or SIGTSTP)");
}

// A request to a store whose serving rank, on this machine, is frozen fails after the store's
// timeout saying what that rank's process shows.
TEST(ProcessFailure, AStoreRequestNamesTheFrozenRankServingIt) {
  testing::ScratchDir dir;
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor probe(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  const int port = probe.local_endpoint().port();
  probe.close();
  // A world of one: rank 0 serves the store and runs its allreduces alone.
  RankProcess serving =
      spawn_rank(dir, 0, 1, "asio-ring", 1500, "tcp://127.0.0.1:" + std::to_string(port));
  StoreOptions options;
  options.token = "process-test";
  options.timeout = milliseconds(20000);
  std::string error;
  try {
    TcpStore client("127.0.0.1", port, options);
    client.set_timeout(milliseconds(300));
    client.set("here", {1});
    ::kill(serving.pid, SIGSTOP);
    client.get("never-set");
  } catch (const CommError& e) {
    error = e.what();
  }
  ::kill(serving.pid, SIGKILL);
  ::waitpid(serving.pid, nullptr, 0);
  EXPECT_NE(error.find("the process serving the store, rank 0 (pid " + std::to_string(serving.pid) +
                       ", this machine), is stopped (SIGSTOP or SIGTSTP)"),
            std::string::npos)
      << error;
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
