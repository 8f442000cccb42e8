#include "common/stop_request.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <iterator>

#include "common/errors.h"

#ifndef _WIN32
#include <signal.h>
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

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Async-signal-safe: atomics, the clock, and re-raising with the default action.
extern "C" void record_stop_request(int signal) {
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

StopRequest::StopRequest() {
  PARTRAIN_CHECK(!g_active.exchange(true), Error, "stop signals are already being watched");
  g_signal = 0;
  g_saving = false;
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
  g_active = false;
}

bool StopRequest::requested() { return g_signal.load() != 0; }
int StopRequest::signal() { return g_signal.load(); }
void StopRequest::set_saving(bool saving) { g_saving = saving; }

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
