// The POSIX side of the launcher: process groups and signals; see platform_process.h.
#include "cli/platform_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#include <sys/prctl.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/cpu_list.h"
#include "common/errors.h"
#include "common/process_state.h"

namespace partrain::cli::platform {

ExitStatus decode_exit_status(int native) {
  ExitStatus status;
  if (WIFEXITED(native)) {
    status.code = WEXITSTATUS(native);
  } else if (WIFSIGNALED(native)) {
    status.signal = WTERMSIG(native);
  } else {
    status.code = native;  // not a final status; report it as is rather than guess
  }
  return status;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "SIG" + std::to_string(signal);
  }
}

std::string describe_exit(const ExitStatus& status) {
  if (status.signal != 0) {
    return "was killed by signal " + std::to_string(status.signal) + " (" +
           signal_name(status.signal) + ")";
  }
  return "exited with code " + std::to_string(status.code);
}

std::string stop_cause_name(int cause) { return signal_name(cause); }

namespace {
void signal_group(int pid, int signal) {
  if (pid <= 0) return;
  // The group may be gone already (ESRCH) or the worker may have not reached setpgid yet
  // (a group that does not exist yet): then signal the process itself.
  if (::kill(-static_cast<pid_t>(pid), signal) != 0) ::kill(static_cast<pid_t>(pid), signal);
}
}  // namespace

WorkerGroup::WorkerGroup() = default;
WorkerGroup::~WorkerGroup() = default;

WorkerChildSetup WorkerGroup::child_setup(const std::vector<int>& cpus) {
  WorkerChildSetup setup;
  setup.launcher_pid = static_cast<int>(current_process_id());
#if defined(__linux__)
  // The mask the kernel reads: bit c of word c / bits-per-word for CPU c (what CPU_SET_S sets).
  constexpr int kBits = static_cast<int>(8 * sizeof(unsigned long));
  cpu_mask_.clear();
  for (const int cpu : cpus) {
    if (cpu < 0) continue;
    const auto word = static_cast<std::size_t>(cpu / kBits);
    if (cpu_mask_.size() <= word) cpu_mask_.resize(word + 1, 0);
    cpu_mask_[word] |= 1UL << (cpu % kBits);
  }
  setup.cpu_mask = cpu_mask_.empty() ? nullptr : cpu_mask_.data();
  setup.cpu_mask_bytes = cpu_mask_.size() * sizeof(unsigned long);
#else
  (void)cpus;
#endif
  return setup;
}

std::string WorkerGroup::worker_cpus() const {
  return pid_ > 0 ? cpu_list(affinity_of(pid_)) : std::string();
}

bool WorkerGroup::request_stop() {
  signal_group(pid_, SIGTERM);
  return true;
}

void WorkerGroup::force_stop() { signal_group(pid_, SIGKILL); }

void interrupt_process(int pid) {
  if (pid > 0) ::kill(static_cast<pid_t>(pid), SIGINT);
}

void set_close_on_exec(NativeHandle native_handle) {
  const int flags = ::fcntl(native_handle, F_GETFD);
  PARTRAIN_CHECK(flags != -1 && ::fcntl(native_handle, F_SETFD, flags | FD_CLOEXEC) != -1, Error,
                 "cannot mark a worker pipe close-on-exec: ", std::strerror(errno));
}

namespace {
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
std::atomic<int> g_signal_count{0};
std::atomic<int> g_last_signal{0};
std::atomic<bool> g_watch_active{false};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

extern "C" void record_stop_signal(int signal) {
  g_last_signal.store(signal);
  g_signal_count.fetch_add(1);
}
}  // namespace

struct StopSignals::Saved {
  struct sigaction old[std::size(kStopSignals)];
  struct sigaction old_child;
};

StopSignals::StopSignals() {
  PARTRAIN_CHECK(!g_watch_active.exchange(true), Error,
                 "the launcher's stop signals are already being watched");
  saved_ = std::make_unique<Saved>();
  g_signal_count = 0;
  g_last_signal = 0;
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i)
    ::sigaction(kStopSignals[i], &action, &saved_->old[i]);
  // An inherited SIGCHLD of SIG_IGN makes the kernel reap workers itself and their exit
  // codes vanish; the launcher needs them.
  struct sigaction child_default {};
  child_default.sa_handler = SIG_DFL;
  sigemptyset(&child_default.sa_mask);
  ::sigaction(SIGCHLD, &child_default, &saved_->old_child);
}

StopSignals::~StopSignals() {
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i)
    ::sigaction(kStopSignals[i], &saved_->old[i], nullptr);
  ::sigaction(SIGCHLD, &saved_->old_child, nullptr);
  g_watch_active = false;
}

int StopSignals::count() const { return g_signal_count.load(); }
int StopSignals::last_signal() const { return g_last_signal.load(); }

// Each worker leads its own process group. A Ctrl-C in the terminal goes to the terminal's
// foreground group, which then holds the launcher alone: the launcher turns it into one
// orderly stop (SIGTERM, grace, SIGKILL) for every worker, instead of each worker seeing
// SIGINT and then SIGTERM as well, and stopping a group also reaches whatever a worker
// started itself. Workers read nothing from the terminal (their stdin is /dev/null), so
// being outside the foreground group costs nothing.
//
// If the launcher dies without a chance to stop them (SIGKILL, a crash), Linux's parent-
// death signal kills each worker. It fires when the thread that forked the worker ends, so
// launch() spawns from the thread that then waits for the workers. getppid() closes the
// race where the launcher died between fork and prctl.
//
// A worker given CPUs is bound to them here, before it runs anything of its own, so that every
// thread it starts inherits the binding. A binding the kernel refuses (a CPU taken away from
// the launcher meanwhile) leaves the worker unbound; the launcher reads back what it got.
void prepare_worker_child(int launcher_pid, const unsigned long* cpu_mask,
                          std::size_t cpu_mask_bytes) noexcept {
  ::setpgid(0, 0);
#if defined(__linux__)
  if (cpu_mask != nullptr && cpu_mask_bytes > 0) {
    ::sched_setaffinity(0, cpu_mask_bytes, reinterpret_cast<const cpu_set_t*>(cpu_mask));
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != static_cast<pid_t>(launcher_pid)) ::kill(::getpid(), SIGKILL);
#else
  (void)launcher_pid;
  (void)cpu_mask;
  (void)cpu_mask_bytes;
#endif
}

}  // namespace partrain::cli::platform
