#include "common/heartbeat.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "common/worker_lines.h"

namespace partrain {

Heartbeat::Heartbeat(double interval_s)
    : thread_([this, interval_s] {
        const std::string line = std::string(kHeartbeatLine) + "\n";
        const auto interval = std::chrono::duration<double>(interval_s);
        std::unique_lock<std::mutex> lock(mutex_);
        // Each wait is bounded by the interval; the destructor ends the loop.
        while (!stop_) {
          std::fputs(line.c_str(), stderr);  // one call: a whole line, never interleaved
          std::fflush(stderr);
          wake_.wait_for(lock, interval, [this] { return stop_; });
        }
      }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace partrain
