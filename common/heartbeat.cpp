#include "common/heartbeat.h"

#include <cstdio>
#include <string>
#include <utility>

#include "common/worker_lines.h"

namespace partrain {

TimedStderrLine::TimedStderrLine(std::string line, std::chrono::duration<double> first,
                                 std::chrono::duration<double> every)
    : thread_([this, line = std::move(line) + "\n", first, every] {
        std::unique_lock<std::mutex> lock(mutex_);
        // Each wait is bounded by `first` or `every`; the destructor ends the loop.
        if (wake_.wait_for(lock, first, [this] { return stop_; })) return;
        while (!stop_) {
          std::fputs(line.c_str(), stderr);  // one call: a whole line, never interleaved
          std::fflush(stderr);
          if (every.count() <= 0) return;
          wake_.wait_for(lock, every, [this] { return stop_; });
        }
      }) {}

TimedStderrLine::~TimedStderrLine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Heartbeat::Heartbeat(double interval_s)
    : TimedStderrLine(std::string(kHeartbeatLine), std::chrono::duration<double>(0),
                      std::chrono::duration<double>(interval_s)) {}

}  // namespace partrain
