#include "common/stop_request.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/errors.h"
#include "common/worker_lines.h"

#ifdef _WIN32
#include <io.h>
#else
#include <signal.h>
#include <unistd.h>

#include <cerrno>
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

// The start-up stop's teller (StopRequest::tell_on_start_up_stop()): set before the courier
// starts, read by it (POSIX) or by the handler (Windows) once g_tell_armed says so.
std::function<void(const std::string&)> g_tell;
std::atomic<bool> g_tell_armed{false};
std::atomic<bool> g_stopping{false};  // a start-up stop is being told: a further signal ends it

// Tells the others why, for at most kStartUpTellBound, then ends the process. The tell runs on
// a thread of its own, which the exit ends wherever it stands: the store may be held by a
// request of the main thread, or gone.
[[noreturn]] void tell_and_end_in_start_up(int signal) {
  struct Told {
    std::mutex mutex;
    std::condition_variable done;
    bool told = false;
  };
  auto told = std::make_shared<Told>();
  const std::string why = std::string(StopRequest::signal_name(signal)) + " before its first step";
  std::thread([told, why, tell = g_tell] {
    try {
      tell(why);
    } catch (const std::exception&) {
      // Nobody to tell: the others find this rank gone all the same.
    }
    const std::lock_guard<std::mutex> lock(told->mutex);
    told->told = true;
    told->done.notify_one();
  }).detach();
  {
    std::unique_lock<std::mutex> lock(told->mutex);
    told->done.wait_for(lock, StopRequest::kStartUpTellBound, [&] { return told->told; });
  }
  end_in_start_up(signal);
}

#ifndef _WIN32
// POSIX: the handler only writes the signal's number to this pipe; the courier thread reads it
// and tells. kDisarm ends the courier without a stop.
int g_courier_pipe[2] = {-1, -1};
std::atomic<int> g_courier_write{-1};
std::thread g_courier;
constexpr unsigned char kDisarm = 0xff;

void disarm_courier() {
  const int fd = g_courier_write.exchange(-1);
  if (fd >= 0) {
    const unsigned char byte = kDisarm;
    (void)!::write(fd, &byte, 1);
  }
  if (g_courier.joinable()) g_courier.join();
  for (int& end : g_courier_pipe) {
    if (end >= 0) ::close(end);
    end = -1;
  }
  g_tell_armed = false;
  g_tell = nullptr;
}
#endif

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Async-signal-safe: atomics, the clock, and re-raising with the default action.
extern "C" void record_stop_request(int signal) {
  if (g_in_start_up.load()) {
    if (!g_tell_armed.load() || g_stopping.exchange(true)) end_in_start_up(signal);
#ifdef _WIN32
    tell_and_end_in_start_up(signal);
#else
    const unsigned char byte = static_cast<unsigned char>(signal);
    const int fd = g_courier_write.load();
    if (fd < 0 || ::write(fd, &byte, 1) != 1) end_in_start_up(signal);
    return;
#endif
  }
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
  g_stopping = false;
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
  g_in_start_up = false;
  stop_telling();
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i) {
#ifdef _WIN32
    std::signal(kStopSignals[i], g_saved[i]);
#else
    ::sigaction(kStopSignals[i], &g_saved[i], nullptr);
#endif
  }
  g_tell_armed = false;
  g_tell = nullptr;
  g_active = false;
}

bool StopRequest::requested() { return g_signal.load() != 0; }
int StopRequest::signal() { return g_signal.load(); }
void StopRequest::set_saving(bool saving) { g_saving = saving; }
void StopRequest::steps_begin() {
  g_in_start_up = false;
  stop_telling();
}

void StopRequest::stop_telling() {
#ifdef _WIN32
  g_tell_armed = false;
  // A stop being told on the handler's thread ends the process within its bound; until then
  // what the teller uses must stay.
  if (g_stopping.load()) std::this_thread::sleep_for(2 * kStartUpTellBound);
#else
  // A signal that came before is told, and ends the process, here: it was one of the start-up.
  disarm_courier();
#endif
}

void StopRequest::tell_on_start_up_stop(std::function<void(const std::string&)> tell) {
  if (!g_in_start_up.load() || g_tell_armed.load()) return;
  g_tell = std::move(tell);
#ifndef _WIN32
  PARTRAIN_CHECK(::pipe(g_courier_pipe) == 0, Error,
                 "cannot make a pipe for the start-up stop: ", std::strerror(errno));
  g_courier = std::thread([read_end = g_courier_pipe[0]] {
    // One read, whose bound is the start-up: a stop signal's number, or kDisarm from
    // steps_begin() or the destructor.
    unsigned char byte = kDisarm;
    while (::read(read_end, &byte, 1) < 0 && errno == EINTR) {
    }
    if (byte != kDisarm) tell_and_end_in_start_up(byte);
  });
  g_courier_write = g_courier_pipe[1];
#endif
  g_tell_armed = true;
}

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
