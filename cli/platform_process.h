// defines: partrain::cli::platform — the operating-system side of the launcher: stopping a
// worker (politely, then by force), decoding an exit status, signal names, the launcher's own
// stop signals (StopSignals), the setup each worker runs in the child before exec
// (WorkerChildSetup), process liveness and the path of this executable.
//
// This is the only launcher file that includes operating-system headers; everything else
// goes through Boost.Process and these few calls. The implementation is POSIX (Linux for the
// parent-death signal and the zombie check).
#pragma once

// clang-format off
// Standard headers first: Boost 1.74's Process and Asio headers use these without
// including them.
#include <memory>
#include <string>
#include <utility>

#include <boost/process/extend.hpp>
// clang-format on

namespace partrain::cli::platform {

// How a process ended: an exit code, or the signal that killed it (signal != 0).
struct ExitStatus {
  int code = 0;
  int signal = 0;
  bool success() const { return code == 0 && signal == 0; }
};

// `native` is the raw status Boost.Process keeps (child::native_exit_code()). Boost's own
// exit_code() folds "killed by signal 9" into "exit code 9", which would misname a crash.
ExitStatus decode_exit_status(int native);

// "SIGKILL" for 9 and so on; "SIG<n>" for a number without a known name.
std::string signal_name(int signal);

// Workers are process-group leaders (see WorkerChildSetup), so a stop reaches anything a
// worker started too. request_stop: SIGTERM; force_stop: SIGKILL. Both ignore a group that
// is already gone. Call them only before the worker has been reaped: until then its pid
// cannot be reused, so the signal cannot reach a stranger.
void request_stop(int pid);
void force_stop(int pid);

// What a Ctrl-C in the terminal does to the launcher (SIGINT to that one process).
void interrupt_process(int pid);

// True while the process exists and has not exited (a zombie counts as exited).
bool process_running(int pid);

int current_process_id();

// The absolute path of the running executable, for spawning itself as a worker.
std::string executable_path();

// Marks a pipe end so that workers started later do not inherit it: a worker holding a copy
// of another worker's stdout would keep that pipe open after its owner died.
void set_close_on_exec(int native_handle);

// The launcher's own stop signals: while one of these objects lives, SIGINT, SIGTERM and
// SIGHUP are recorded instead of killing the launcher, so it can stop its workers first.
// The previous handlers are restored on destruction. One at a time.
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

// Runs in the child between fork and exec, so only async-signal-safe calls (see the .cpp).
void prepare_worker_child(int launcher_pid) noexcept;

// Boost.Process initializer that runs prepare_worker_child in each worker.
struct WorkerChildSetup : boost::process::extend::handler {
  int launcher_pid = 0;
  template <typename Executor>
  void on_exec_setup(Executor&) const {
    prepare_worker_child(launcher_pid);
  }
};

}  // namespace partrain::cli::platform
