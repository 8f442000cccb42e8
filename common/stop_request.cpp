#include "common/stop_request.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>

#include "common/errors.h"
#include "common/worker_lines.h"

#ifdef _WIN32
#include <io.h>
#else
#include <signal.h>
#include <unistd.h>
#endif

namespace partrain {
namespace {

#ifdef _WIN32
constexpr int kStopSignals[] = {SIGINT, SIGTERM};
using SavedHandler = void (*)(int);
#else
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGUSR1};
using SavedHandler = struct sigaction;
#endif

std::atomic<int> g_signal{0};
std::atomic<bool> g_saving{false};
std::atomic<bool> g_active{false};
// steady_clock nanoseconds of the first signal; the clock is a vDSO read, safe in a handler.
std::atomic<long long> g_first_ns{0};
static_assert(std::atomic<long long>::is_always_lock_free, "the handler needs lock-free atomics");
SavedHandler g_saved[std::size(kStopSignals)];
// Until steps_begin(): a stop signal ends the process, after its line of kStartUpLines (one per
// stop signal, made before the handlers are set, so the handler only reads them).
std::atomic<bool> g_in_start_up{false};
constexpr std::size_t kLineBytes = 128;
struct StartUpLine {
  char text[kLineBytes];
  unsigned bytes;
};
StartUpLine g_start_up_lines[std::size(kStopSignals)];

void make_start_up_lines() {
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
    const std::string line =
        format_start_up_stop_line(StopRequest::signal_name(kStopSignals[i])) + "\n";
    StartUpLine& to = g_start_up_lines[i];
    to.bytes = static_cast<unsigned>(std::min(line.size(), kLineBytes));
    std::copy_n(line.data(), to.bytes, to.text);
  }
}

// Async-signal-safe on POSIX: write() and _exit(). Windows runs the handler on a thread of its
// own, where flushing stdout is safe too.
[[noreturn]] void end_in_start_up(int signal) {
  std::size_t i = 0;
  while (i + 1 < std::size(kStopSignals) && kStopSignals[i] != signal) ++i;
  const StartUpLine& line = g_start_up_lines[i];
#ifdef _WIN32
  std::fflush(stdout);
  (void)::_write(2, line.text, line.bytes);
#else
  (void)!::write(STDERR_FILENO, line.text, line.bytes);
#endif
  ::_exit(kExitStopped);
}

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Async-signal-safe: atomics, the clock, and re-raising with the default action.
extern "C" void record_stop_request(int signal) {
  if (g_in_start_up.load()) end_in_start_up(signal);
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, signal)) {
    g_first_ns.store(now_ns());
    return;
  }
  const double since = static_cast<double>(now_ns() - g_first_ns.load()) * 1e-9;
  if (g_saving.load() || since > StopRequest::kRepeatWindowSeconds) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
}

}  // namespace

StopRequest::StopRequest(bool in_start_up) {
  PARTRAIN_CHECK(!g_active.exchange(true), Error, "stop signals are already being watched");
  g_signal = 0;
  g_saving = false;
  make_start_up_lines();
  g_in_start_up = in_start_up;
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
#ifdef _WIN32
    g_saved[i] = std::signal(kStopSignals[i], record_stop_request);
#else
    struct sigaction action {};
    action.sa_handler = record_stop_request;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a read or wait in progress goes on
    ::sigaction(kStopSignals[i], &action, &g_saved[i]);
#endif
  }
}

StopRequest::~StopRequest() {
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
#ifdef _WIN32
    std::signal(kStopSignals[i], g_saved[i]);
#else
    ::sigaction(kStopSignals[i], &g_saved[i], nullptr);
#endif
  }
  g_in_start_up = false;
  g_active = false;
}

bool StopRequest::requested() { return g_signal.load() != 0; }
int StopRequest::signal() { return g_signal.load(); }
void StopRequest::set_saving(bool saving) { g_saving = saving; }
void StopRequest::steps_begin() { g_in_start_up = false; }

const char* StopRequest::signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
#ifndef _WIN32
    case SIGUSR1:
      return "SIGUSR1";
#endif
    default:
      return "a stop request";
  }
}

}  // namespace partrain
