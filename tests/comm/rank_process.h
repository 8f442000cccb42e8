// defines: RankProcess and expect_survivors_name() — for the tests that run ranks as real
// processes (comm_rank_process), injure one with a signal, and check what the others say.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace partrain::comm {

struct RankProcess {
  pid_t pid = -1;
  std::filesystem::path log;    // its stderr
  std::filesystem::path ready;  // it creates this once its communicator is up
  int status = -1;              // waitpid's, once it exited
  std::chrono::steady_clock::time_point exited;
};

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits (30 s at most) until every rank is ready, sends `signal_number` to `victim`, and
// checks that every other rank exits 3 with a PeerError naming the victim within `bound`, and
// saying what the victim's process shows: "rank V (pid P, this machine) " and `seen`, by
// default "is stopped" for SIGSTOP and "has ended" otherwise.
// Survivors still running 5 s after the bound are killed (and the test fails), so this
// always returns with every process reaped but the victim, which the caller's signal may
// have left stopped: it is killed and reaped too.
inline void expect_survivors_name(std::vector<RankProcess>& ranks, int victim, int signal_number,
                                  std::chrono::milliseconds bound, std::string seen = "") {
  if (seen.empty()) seen = signal_number == SIGSTOP ? "is stopped" : "has ended";
  using Clock = std::chrono::steady_clock;
  using std::chrono::milliseconds;
  const int world = static_cast<int>(ranks.size());
  const auto ready_by = Clock::now() + std::chrono::seconds(30);
  bool all_ready = true;
  for (auto& p : ranks) {
    while (!std::filesystem::exists(p.ready) && Clock::now() < ready_by) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    all_ready &= std::filesystem::exists(p.ready);
  }
  const auto injured_at = Clock::now();
  if (all_ready) ::kill(ranks[victim].pid, signal_number);
  int running = world - 1;
  while (all_ready && running > 0 && Clock::now() < injured_at + bound + std::chrono::seconds(5)) {
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
  ASSERT_TRUE(all_ready) << "ranks did not start: " << read_file(ranks[0].log);
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    const std::string log = read_file(ranks[r].log);
    ASSERT_NE(ranks[r].status, -1) << "rank " << r << " still running 5 s after the bound";
    EXPECT_TRUE(WIFEXITED(ranks[r].status) && WEXITSTATUS(ranks[r].status) == 3)
        << "rank " << r << " status " << ranks[r].status << ": " << log;
    EXPECT_NE(log.find("peer-error rank=" + std::to_string(victim) + ":"), std::string::npos)
        << "rank " << r << ": " << log;
    EXPECT_LE(ranks[r].exited - injured_at, bound) << "rank " << r << " took too long: " << log;
    // The victim shares this machine: what its process shows is said (peer_process.h). Killed,
    // it is a process this test has yet to reap; stopped, it is stopped still.
    const std::string named = "rank " + std::to_string(victim) + " (pid " +
                              std::to_string(ranks[victim].pid) + ", this machine) " + seen;
    EXPECT_NE(log.find(named), std::string::npos) << "rank " << r << ": " << log;
  }
}

}  // namespace partrain::comm
