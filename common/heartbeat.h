// defines: TimedStderrLine — a thread that writes a line on stderr after a delay, and again at
// an interval if asked, while it lives; Heartbeat — the one that prints kHeartbeatLine
// (common/worker_lines.h) at a fixed interval, so that the launcher can tell a worker that no
// longer runs (SIGSTOP, a stalled host) from one that is busy or waiting. No LibTorch.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace partrain {

class TimedStderrLine {
 public:
  // `line` (without its newline) after `first`, then every `every` (once only where `every` is
  // zero).
  TimedStderrLine(std::string line, std::chrono::duration<double> first,
                  std::chrono::duration<double> every);
  ~TimedStderrLine();  // stops the thread within one wake-up (it waits on a condition variable)
  TimedStderrLine(const TimedStderrLine&) = delete;
  TimedStderrLine& operator=(const TimedStderrLine&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

class Heartbeat : public TimedStderrLine {
 public:
  // interval_s > 0. The first line comes at once.
  explicit Heartbeat(double interval_s);
};

}  // namespace partrain
