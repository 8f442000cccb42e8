// defines: partrain::cli::platform — the operating-system side of the launcher: the group of
// processes each worker stands for (WorkerGroup: stop it politely, then by force), decoding
// and naming an exit status, the launcher's own stop signals (StopSignals), process liveness
// and the path of this executable.
//
// This is the only launcher header that knows about operating systems; everything else goes
// through Boost.Process and these few calls. Two implementations:
//   platform_process_posix.cpp    process groups, signals, Linux's parent-death signal
//   platform_process_windows.cpp  job objects, console control events, a named stop event
#pragma once

// clang-format off
// Standard headers first: Boost 1.74's Process and Asio headers use these without
// including them.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#ifdef _WIN32
// Boost 1.74's Windows handle code (reached through extend.hpp) uses DWORD and
// GetHandleInformation without including what declares them; the whole library does.
#include <boost/process.hpp>
#endif
#include <boost/process/extend.hpp>
// clang-format on

namespace partrain::cli::platform {

// How a process ended.
//   POSIX: an exit code, or the signal that killed it (signal != 0).
//   Windows: there are no signals. A process ends with a 32-bit exit code, and a crash, an
//   abort by the runtime or a Ctrl-Break leaves an NTSTATUS error there (0xC0000005 and so
//   on): such a code is kept in `code` with `crashed` set, since no program exits with it.
struct ExitStatus {
  int code = 0;
  int signal = 0;
  bool crashed = false;
  bool success() const { return code == 0 && signal == 0 && !crashed; }
  // Ended by something other than its own exit: a signal, a crash.
  bool killed() const { return signal != 0 || crashed; }
};

// `native` is the raw status Boost.Process keeps (child::native_exit_code()). Boost's own
// exit_code() folds "killed by signal 9" into "exit code 9", which would misname a crash.
ExitStatus decode_exit_status(int native);

// "exited with code 3", "was killed by signal 9 (SIGKILL)" (POSIX),
// "ended with status 0xC0000005 (STATUS_ACCESS_VIOLATION)" (Windows).
std::string describe_exit(const ExitStatus& status);

// POSIX: "SIGKILL" for 9 and so on; "SIG<n>" for a number without a known name.
std::string signal_name(int signal);

// What StopSignals::last_signal() returned, in words: POSIX the signal's name; Windows
// "CTRL_C_EVENT", "CTRL_BREAK_EVENT", "CTRL_CLOSE_EVENT" or "a stop request".
std::string stop_cause_name(int cause);

// How a worker is ended when it outlives its grace period, as the launcher names it.
#ifdef _WIN32
inline constexpr const char* kForceStopName = "TerminateJobObject";
using NativeHandle = void*;  // a HANDLE
#else
inline constexpr const char* kForceStopName = "SIGKILL";
using NativeHandle = int;                // a file descriptor
#endif

struct WorkerChildSetup;

// One worker and whatever it starts, as the operating system sees them.
//   POSIX: the process group the worker leads (WorkerChildSetup makes it). A stop reaches
//     anything the worker started too. Use it only before the worker has been reaped: until
//     then its pid cannot be reused, so a signal cannot reach a stranger.
//   Windows: a job object, made before the worker and holding it from its first instruction
//     (it starts suspended), with kill-on-close: when the launcher ends, however it ends, its
//     handle closes and Windows ends every process in the job, so no worker outlives it.
//     Destroying a WorkerGroup therefore also ends whatever the worker left running.
class WorkerGroup {
 public:
  WorkerGroup();
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // The Boost.Process initializer for spawning this group's worker. On Linux a worker given
  // `cpus` is bound to them from its start (Note [Binding ranks to cores] in
  // comm_backends/placement.cpp); elsewhere they are not used.
  WorkerChildSetup child_setup(const std::vector<int>& cpus = {});
  // Tells the group which process it leads, once the spawn succeeded.
  void started(int pid) { pid_ = pid; }
  // The CPUs the worker may run on, as the system says now ("0-3,8"); empty where it does not.
  std::string worker_cpus() const;

  // The polite stop. POSIX: SIGTERM to the group. Windows: CTRL_BREAK_EVENT to the worker's
  // console process group, which reaches it only when the launcher shares a console with it;
  // false when the event could not be sent (no console, or a Windows emulation that cannot),
  // so the caller should not wait for it to work.
  bool request_stop();
  // The stop that cannot be refused. POSIX: SIGKILL to the group; Windows: TerminateJobObject.
  // Both ignore a group that is already gone.
  void force_stop();

 private:
  int pid_ = 0;
#ifdef _WIN32
  void* job_ = nullptr;  // the job object's HANDLE
#else
  std::vector<unsigned long> cpu_mask_;  // child_setup()'s cpus as sched_setaffinity() takes them
#endif
};

// What a Ctrl-C in the terminal does to the launcher.
//   POSIX: SIGINT to that one process.
//   Windows: a console control event goes to every process of a console or of a process
//   group, never to one process, so this sets the launcher's stop event instead (see
//   StopSignals), which a supervisor without a console can use too.
void interrupt_process(int pid);

// The absolute path of the running executable, for spawning itself as a worker.
std::string executable_path();

// Marks a pipe end so that workers started later do not inherit it: a worker holding a copy
// of another worker's stdout would keep that pipe open after its owner died.
void set_close_on_exec(NativeHandle handle);

// The launcher's own stop signals. While one of these objects lives:
//   POSIX: SIGINT, SIGTERM, SIGHUP and SIGUSR1 (Slurm's usual warning before a preemption)
//     are recorded instead of killing the launcher, so it can stop its workers first; the previous
//     handlers are restored on destruction.
//   Windows: Ctrl-C, Ctrl-Break and the console closing (CTRL_CLOSE_EVENT, log-off, shut-down)
//     are recorded by a console control handler; so is the named event
//     Local\partrain-stop-<launcher pid> being set (stop_event_name), Windows' closest thing
//     to SIGTERM: a console event cannot be aimed at one process. last_signal() then returns
//     2 (CTRL_C_EVENT), 21 (CTRL_BREAK_EVENT), 1 (closing) or 15 (the stop event), the
//     numbers of the matching signals, so the exit code 128 + that means the same as on POSIX.
// One at a time.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  int count() const;        // signals received since construction
  int last_signal() const;  // the most recent one, 0 if none

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

#ifdef _WIN32
// "Local\partrain-stop-1234": the event that asks launcher 1234 to stop its run.
std::string stop_event_name(int launcher_pid);

// Creation flags for a worker: suspended until it is in its job, a console process group of
// its own (so CTRL_BREAK_EVENT can be aimed at it, and a Ctrl-C in the console reaches the
// launcher alone, as on POSIX).
unsigned long worker_creation_flags();
// Puts a freshly created, suspended worker into its job and lets it run; on failure ends it
// and throws, so no worker ever runs outside a job.
void adopt_worker(void* job, void* process, void* thread);

struct WorkerChildSetup : boost::process::extend::handler {
  void* job = nullptr;
  template <typename Executor>
  void on_setup(Executor& e) const {
    e.creation_flags |= worker_creation_flags();
  }
  template <typename Executor>
  void on_success(Executor& e) const {
    adopt_worker(job, e.proc_info.hProcess, e.proc_info.hThread);
  }
};
#else
// Runs in the child between fork and exec, so only async-signal-safe calls (see the .cpp).
// A non-empty cpu_mask (cpu_mask_bytes bytes, made before the fork) binds the worker to it.
void prepare_worker_child(int launcher_pid, const unsigned long* cpu_mask,
                          std::size_t cpu_mask_bytes) noexcept;

// Boost.Process initializer that runs prepare_worker_child in each worker.
struct WorkerChildSetup : boost::process::extend::handler {
  int launcher_pid = 0;
  const unsigned long* cpu_mask = nullptr;  // the WorkerGroup's, which outlives the spawn
  std::size_t cpu_mask_bytes = 0;
  template <typename Executor>
  void on_exec_setup(Executor&) const {
    prepare_worker_child(launcher_pid, cpu_mask, cpu_mask_bytes);
  }
};
#endif

}  // namespace partrain::cli::platform
