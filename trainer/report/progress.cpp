#include "trainer/report/progress.h"

#include <algorithm>
#include <cstdio>

#if defined(_WIN32)
#include <io.h>
#else
#include <unistd.h>
#endif

namespace partrain {
namespace {

bool stdout_is_terminal() {
#if defined(_WIN32)
  return _isatty(_fileno(stdout)) != 0;
#else
  return isatty(fileno(stdout)) != 0;
#endif
}

}  // namespace

Progress::Progress(bool enabled) : enabled_(enabled), terminal_(enabled && stdout_is_terminal()) {}

void Progress::update(const std::string& line, double fraction, bool force_line) {
  if (!enabled_) return;
  if (terminal_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * kWidth);
    std::string text(1, '[');  // appended piece by piece: GCC 12 warns (-Wrestrict) on a + chain
    text.append(filled, '#').append(kWidth - filled, '.').append("] ").append(line);
    std::printf("\r%-110s", text.c_str());
    std::fflush(stdout);
  } else if (force_line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void Progress::finish(const std::string& line) {
  if (!enabled_) return;
  std::printf(terminal_ ? "\r%-110s\n" : "%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace partrain
