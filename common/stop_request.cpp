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

#include "common/abrupt_exit.h"
#include "common/errors.h"
#include "common/worker_lines.h"

#ifdef _WIN32
#include <io.h>
#else
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace partrain {
namespace {

#ifdef _WIN32
// SIGBREAK is CTRL_BREAK_EVENT, the polite stop `partrain run` sends its workers there.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGBREAK};
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

// Async-signal-safe on POSIX: unlink(), write() and _exit(). Windows runs the handler on a
// thread of its own; it flushes nothing either, since the main thread may hold stdout's lock
// (a worker's stdout is unbuffered there, see worker_command.cpp).
[[noreturn]] void end_in_start_up(int signal) {
  remove_at_abrupt_exit();
  std::size_t i = 0;
  while (i + 1 < std::size(kStopSignals) && kStopSignals[i] != signal) ++i;
  const StartUpLine& line = g_start_up_lines[i];
#ifdef _WIN32
  (void)::_write(2, line.text, line.bytes);
#else
  (void)!::write(STDERR_FILENO, line.text, line.bytes);
#endif
  ::_exit(kExitStopped);
}

// The start-up stop's teller (StopRequest::tell_on_start_up_stop()), and where it stands. The
// handler takes it from kArmed to kTelling, stop_telling() from kArmed to kDisarmed; whoever
// comes second sees the other's state: a second signal ends the process at once, and
// stop_telling() waits for a tell under way to end the process.
constexpr int kUnarmed = 0;
constexpr int kArmed = 1;
constexpr int kTelling = 2;
constexpr int kDisarmed = 3;
std::atomic<int> g_tell_state{kUnarmed};
std::function<void(const std::string&)> g_tell;  // set before kArmed, cleared after kDisarmed

// Tells the others why, for at most kStartUpTellBound, then ends the process. The tell runs on
// a thread of its own, which the exit ends wherever it stands: the store may be held by a
// request of the main thread, or gone.
[[noreturn]] void tell_and_end_in_start_up(int signal) {
  try {
    struct Told {
      std::mutex mutex;
      std::condition_variable done;
      bool told = false;
    };
    auto told = std::make_shared<Told>();
    const std::string why =
        std::string(StopRequest::signal_name(signal)) + std::string(kStartUpStopWhy);
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
    std::unique_lock<std::mutex> lock(told->mutex);
    told->done.wait_for(lock, StopRequest::kStartUpTellBound, [&] { return told->told; });
  } catch (const std::exception&) {
    // No thread to tell from: the process ends all the same.
  }
  end_in_start_up(signal);
}

#ifndef _WIN32
// POSIX: the handler only writes the signal's number to this pipe; the courier thread reads it
// and tells. kDisarm ends the courier without a stop. The pipe is made once and stays open, so
// that a handler late with its write never writes into a descriptor reused for something else.
int g_courier_pipe[2] = {-1, -1};
std::thread g_courier;
constexpr unsigned char kDisarm = 0xff;

void make_courier_pipe() {
  if (g_courier_pipe[0] >= 0) return;
  PARTRAIN_CHECK(::pipe2(g_courier_pipe, O_CLOEXEC) == 0, Error,
                 "cannot make a pipe for the start-up stop: ", std::strerror(errno));
  // The handler never blocks on it (a byte or two are ever in it).
  ::fcntl(g_courier_pipe[1], F_SETFL, ::fcntl(g_courier_pipe[1], F_GETFL) | O_NONBLOCK);
}
#endif

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Async-signal-safe: atomics, the clock, and re-raising with the default action.
extern "C" void record_stop_request(int signal) {
#ifdef _WIN32
  // The C runtime sets a signal back to its default before it calls the handler: without this
  // a second signal inside the window would end the process instead of counting as the same.
  // Not once the StopRequest has put the previous handlers back (a console event runs this on
  // a thread of its own, which may come late).
  if (g_active.load()) std::signal(signal, record_stop_request);
#endif
  if (g_in_start_up.load()) {
    // Recorded too: should the stop not end the process in the start-up after all (the loop
    // began meanwhile), the loop finds it.
    int none = 0;
    if (g_signal.compare_exchange_strong(none, signal)) g_first_ns.store(now_ns());
    int armed = kArmed;
    if (!g_tell_state.compare_exchange_strong(armed, kTelling)) end_in_start_up(signal);
#ifdef _WIN32
    tell_and_end_in_start_up(signal);
#else
    const unsigned char byte = static_cast<unsigned char>(signal);
    const int saved_errno = errno;  // the interrupted code may be about to read it
    if (::write(g_courier_pipe[1], &byte, 1) != 1) end_in_start_up(signal);
    errno = saved_errno;
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
  g_tell_state = kUnarmed;
  g_active = false;
}

bool StopRequest::requested() { return g_signal.load() != 0; }
int StopRequest::signal() { return g_signal.load(); }
void StopRequest::set_saving(bool saving) { g_saving = saving; }
void StopRequest::steps_begin() {
  g_in_start_up = false;
  stop_telling();
}

bool StopRequest::in_start_up() { return g_in_start_up.load(); }

void StopRequest::stop_telling() {
  int state = kArmed;
  if (g_tell_state.compare_exchange_strong(state, kDisarmed)) {
#ifndef _WIN32
    const unsigned char byte = kDisarm;
    (void)!::write(g_courier_pipe[1], &byte, 1);
#endif
  } else if (state == kTelling) {
    // A stop being told ends the process within its bound; until then what the teller uses
    // must stay.
#ifdef _WIN32
    std::this_thread::sleep_for(2 * kStartUpTellBound);
#endif
  }
#ifndef _WIN32
  if (g_courier.joinable()) g_courier.join();  // bounded: the courier has its byte
#endif
  if (g_tell_state.load() == kDisarmed) g_tell = nullptr;
}

void StopRequest::tell_on_start_up_stop(std::function<void(const std::string&)> tell) {
  if (!g_in_start_up.load() || g_tell_state.load() != kUnarmed) return;
  g_tell = std::move(tell);
#ifndef _WIN32
  make_courier_pipe();
  g_courier = std::thread([] {
    // One read, whose bound is the start-up: a stop signal's number, or kDisarm from
    // stop_telling().
    unsigned char byte = kDisarm;
    while (::read(g_courier_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    if (byte != kDisarm) tell_and_end_in_start_up(byte);
  });
#endif
  g_tell_state = kArmed;
}

const char* StopRequest::signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
#ifdef _WIN32
    case SIGBREAK:
      return "CTRL_BREAK_EVENT";
#else
    case SIGUSR1:
      return "SIGUSR1";
#endif
    default:
      return "a stop request";
  }
}

}  // namespace partrain
