// The Windows side of the launcher: job objects, console control events and a named stop
// event; see platform_process.h.
//
// Windows has neither process groups that a signal can reach nor signals. What stands in:
//   * a job object per worker, with kill-on-close. The launcher holds the only handle, and
//     Windows closes a process's handles however it ends (TerminateProcess, a crash), which
//     ends every process in the job: the parent-death signal of Linux, for the whole tree.
//     The worker starts suspended and runs only once it is in the job, so a process it
//     starts at once cannot slip out. Die-on-unhandled-exception: a crashing worker ends at
//     once instead of waiting in an error dialog nobody answers, which would hang the group.
//   * the polite stop is CTRL_BREAK_EVENT to the worker's console process group. Windows
//     delivers it only to processes attached to the caller's console, and not at all when
//     the launcher has none (a service, a scheduler): then request_stop says so and the
//     launcher ends the worker's job at once. Wine 8, which the Windows tests run under,
//     delivers no CTRL_BREAK_EVENT at all (only CTRL_C_EVENT to a whole console).
//   * the launcher's own stop: a console control handler for Ctrl-C, Ctrl-Break and the
//     console closing, plus a named event for whoever has no console to type Ctrl-C into.
#include "cli/platform_process.h"

// clang-format off
#include <windows.h>
// clang-format on

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <string>

#include "common/errors.h"
#include "common/process_state.h"

namespace partrain::cli::platform {
namespace {

// The cause numbers StopSignals reports: those of the matching POSIX signals.
constexpr int kCauseClose = 1;         // like SIGHUP
constexpr int kCauseCtrlC = 2;         // SIGINT
constexpr int kCauseStopRequest = 15;  // SIGTERM
constexpr int kCauseCtrlBreak = 21;    // MinGW's and MSVC's SIGBREAK

// What a stopped worker's job is ended with: the status Windows itself gives a console
// program that a Ctrl-C or Ctrl-Break ended.
constexpr DWORD kStatusControlCExit = 0xC000013A;

std::string last_error_text(DWORD error) {
  char* text = nullptr;
  const DWORD n = ::FormatMessageA(
      FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
      nullptr, error, 0, reinterpret_cast<char*>(&text), 0, nullptr);
  std::string message = n > 0 && text != nullptr ? std::string(text, n) : "";
  if (text != nullptr) ::LocalFree(text);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r' ||
                              message.back() == ' ' || message.back() == '.')) {
    message.pop_back();
  }
  return detail::concat(message.empty() ? "error" : message, " (Windows error ", error, ")");
}

struct StatusName {
  std::uint32_t status;
  const char* name;
};

// The statuses a crashed, aborted or stopped program ends with (ntstatus.h).
constexpr StatusName kStatusNames[] = {
    {0x80000003, "STATUS_BREAKPOINT"},
    {0xC0000005, "STATUS_ACCESS_VIOLATION"},
    {0xC0000006, "STATUS_IN_PAGE_ERROR"},
    {0xC0000017, "STATUS_NO_MEMORY"},
    {0xC000001D, "STATUS_ILLEGAL_INSTRUCTION"},
    {0xC0000025, "STATUS_NONCONTINUABLE_EXCEPTION"},
    {0xC000008C, "STATUS_ARRAY_BOUNDS_EXCEEDED"},
    {0xC000008E, "STATUS_FLOAT_DIVIDE_BY_ZERO"},
    {0xC0000090, "STATUS_FLOAT_INVALID_OPERATION"},
    {0xC0000094, "STATUS_INTEGER_DIVIDE_BY_ZERO"},
    {0xC0000095, "STATUS_INTEGER_OVERFLOW"},
    {0xC0000096, "STATUS_PRIVILEGED_INSTRUCTION"},
    {0xC00000FD, "STATUS_STACK_OVERFLOW"},
    {0xC0000135, "STATUS_DLL_NOT_FOUND"},
    {0xC0000139, "STATUS_ENTRYPOINT_NOT_FOUND"},
    {0xC000013A, "STATUS_CONTROL_C_EXIT"},
    {0xC0000142, "STATUS_DLL_INIT_FAILED"},
    {0xC0000374, "STATUS_HEAP_CORRUPTION"},
    {0xC0000409, "STATUS_STACK_BUFFER_OVERRUN"},
    {0xC0000417, "STATUS_INVALID_CRUNTIME_PARAMETER"},
    {0xC0000420, "STATUS_ASSERTION_FAILURE"},
};

// NTSTATUS errors (severity 3) and the breakpoint that DebugBreak() ends a process with.
bool is_crash_status(std::uint32_t code) { return code >= 0xC0000000u || code == 0x80000003u; }

}  // namespace

ExitStatus decode_exit_status(int native) {
  ExitStatus status;
  status.code = native;
  status.crashed = is_crash_status(static_cast<std::uint32_t>(native));
  return status;
}

std::string describe_exit(const ExitStatus& status) {
  const auto code = static_cast<std::uint32_t>(status.code);
  if (!status.crashed) return "exited with code " + std::to_string(code);
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08X", static_cast<unsigned>(code));
  std::string text = std::string("ended with status ") + hex;
  for (const auto& [value, name] : kStatusNames) {
    if (value == code) return text + " (" + name + ")";
  }
  return text;
}

std::string signal_name(int signal) { return "SIG" + std::to_string(signal); }

std::string stop_cause_name(int cause) {
  switch (cause) {
    case kCauseCtrlC:
      return "CTRL_C_EVENT";
    case kCauseCtrlBreak:
      return "CTRL_BREAK_EVENT";
    case kCauseClose:
      return "CTRL_CLOSE_EVENT";
    case kCauseStopRequest:
      return "a stop request";
    default:
      return "stop cause " + std::to_string(cause);
  }
}

std::string stop_event_name(int launcher_pid) {
  return "Local\\partrain-stop-" + std::to_string(launcher_pid);
}

WorkerGroup::WorkerGroup() {
  HANDLE job = ::CreateJobObjectW(nullptr, nullptr);  // not inheritable: no worker holds it
  PARTRAIN_CHECK(job != nullptr, Error,
                 "cannot make a job object for a worker: ", last_error_text(::GetLastError()));
  JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits{};
  limits.BasicLimitInformation.LimitFlags =
      JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION;
  if (!::SetInformationJobObject(job, JobObjectExtendedLimitInformation, &limits, sizeof limits)) {
    const DWORD error = ::GetLastError();
    ::CloseHandle(job);
    throw Error("cannot make a worker's job object kill on close: " + last_error_text(error));
  }
  job_ = job;
}

WorkerGroup::~WorkerGroup() {
  if (job_ != nullptr) ::CloseHandle(static_cast<HANDLE>(job_));
}

// Workers are not bound to CPUs on Windows (Note [Binding ranks to cores] in
// comm_backends/placement.cpp): `cpus` is not used.
WorkerChildSetup WorkerGroup::child_setup(const std::vector<int>&) {
  WorkerChildSetup setup;
  setup.job = job_;
  return setup;
}

std::string WorkerGroup::worker_cpus() const { return {}; }

bool WorkerGroup::request_stop() {
  if (pid_ <= 0) return false;
  // The worker leads a console process group of its own (worker_creation_flags), whose id
  // is its pid.
  return ::GenerateConsoleCtrlEvent(CTRL_BREAK_EVENT, static_cast<DWORD>(pid_)) != 0;
}

void WorkerGroup::force_stop() {
  if (job_ != nullptr) ::TerminateJobObject(static_cast<HANDLE>(job_), kStatusControlCExit);
}

unsigned long worker_creation_flags() {
  DWORD flags = CREATE_SUSPENDED | CREATE_NEW_PROCESS_GROUP;
  // A console program started by a process without a console gets a new console, with a
  // window of its own, per worker; this keeps them hidden.
  if (::GetConsoleWindow() == nullptr) flags |= CREATE_NO_WINDOW;
  return flags;
}

void adopt_worker(void* job, void* process, void* thread) {
  auto fail = [process](const char* what) {
    const DWORD error = ::GetLastError();
    ::TerminateProcess(static_cast<HANDLE>(process), kStatusControlCExit);
    throw Error(std::string(what) + ": " + last_error_text(error));
  };
  if (!::AssignProcessToJobObject(static_cast<HANDLE>(job), static_cast<HANDLE>(process)))
    fail("cannot put the worker into its job object");
  if (::ResumeThread(static_cast<HANDLE>(thread)) == static_cast<DWORD>(-1))
    fail("cannot start the worker's suspended thread");
}

void interrupt_process(int pid) {
  if (pid <= 0) return;
  const std::string name = stop_event_name(pid);
  HANDLE event = ::OpenEventA(EVENT_MODIFY_STATE, FALSE, name.c_str());
  if (event == nullptr) return;  // no launcher of that pid is watching (any more)
  ::SetEvent(event);
  ::CloseHandle(event);
}

void set_close_on_exec(NativeHandle handle) {
  PARTRAIN_CHECK(
      ::SetHandleInformation(static_cast<HANDLE>(handle), HANDLE_FLAG_INHERIT, 0), Error,
      "cannot keep a worker pipe from being inherited: ", last_error_text(::GetLastError()));
}

namespace {
std::atomic<int> g_signal_count{0};
std::atomic<int> g_last_signal{0};
std::atomic<bool> g_watch_active{false};

// After CTRL_CLOSE_EVENT (and log-off, shut-down) Windows ends the process as soon as the
// handler returns, and after about 5 s anyway. Holding the handler (it runs on a thread of
// its own) lets the launcher stop its workers in order first; if time runs out, the jobs'
// kill-on-close still ends them.
constexpr int kClosePolls = 90;
constexpr DWORD kClosePollMs = 50;  // 90 x 50 ms: 4.5 s, inside Windows' 5 s

BOOL WINAPI record_console_event(DWORD event) {
  int cause = kCauseClose;
  if (event == CTRL_C_EVENT) cause = kCauseCtrlC;
  if (event == CTRL_BREAK_EVENT) cause = kCauseCtrlBreak;
  g_last_signal.store(cause);
  g_signal_count.fetch_add(1);
  if (cause == kCauseClose) {
    for (int i = 0; i < kClosePolls && g_watch_active.load(); ++i) ::Sleep(kClosePollMs);
  }
  return TRUE;
}
}  // namespace

struct StopSignals::Saved {
  HANDLE stop_event = nullptr;
};

StopSignals::StopSignals() {
  PARTRAIN_CHECK(!g_watch_active.exchange(true), Error,
                 "the launcher's stop signals are already being watched");
  saved_ = std::make_unique<Saved>();
  g_signal_count = 0;
  g_last_signal = 0;
  const std::string name = stop_event_name(static_cast<int>(current_process_id()));
  // Manual reset, so a request stays visible until count() has taken it.
  saved_->stop_event = ::CreateEventA(nullptr, TRUE, FALSE, name.c_str());
  if (saved_->stop_event == nullptr) {
    const DWORD error = ::GetLastError();
    g_watch_active = false;
    throw Error("cannot make the launcher's stop event " + name + ": " + last_error_text(error));
  }
  ::SetConsoleCtrlHandler(record_console_event, TRUE);
}

StopSignals::~StopSignals() {
  ::SetConsoleCtrlHandler(record_console_event, FALSE);
  ::CloseHandle(saved_->stop_event);
  g_watch_active = false;
}

int StopSignals::count() const {
  if (::WaitForSingleObject(saved_->stop_event, 0) == WAIT_OBJECT_0) {
    ::ResetEvent(saved_->stop_event);
    g_last_signal.store(kCauseStopRequest);
    g_signal_count.fetch_add(1);
  }
  return g_signal_count.load();
}

int StopSignals::last_signal() const { return g_last_signal.load(); }

}  // namespace partrain::cli::platform
