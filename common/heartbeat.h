// defines: Heartbeat — a thread that prints kHeartbeatLine (common/worker_lines.h) on stderr at
// a fixed interval while it lives, so that the launcher can tell a worker that no longer runs
// (SIGSTOP, a stalled host) from one that is busy or waiting. No LibTorch.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

namespace partrain {

class Heartbeat {
 public:
  // interval_s > 0. The first line comes at once.
  explicit Heartbeat(double interval_s);
  ~Heartbeat();  // stops the thread within one wake-up (it waits on a condition variable)
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace partrain
