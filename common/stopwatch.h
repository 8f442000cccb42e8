// defines: Clock, TimeSpan and seconds_since() — elapsed wall time on the monotonic clock.
#pragma once

#include <chrono>

namespace partrain {

using Clock = std::chrono::steady_clock;

// An interval [start, end) of Clock.
struct TimeSpan {
  Clock::time_point start;
  Clock::time_point end;
};

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace partrain
