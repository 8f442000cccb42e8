// defines: Clock and seconds_since() — elapsed wall time on the monotonic clock.
#pragma once

#include <chrono>

namespace partrain {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace partrain
