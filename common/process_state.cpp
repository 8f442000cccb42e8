#include "common/process_state.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <process.h>
#include <windows.h>
#else
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace partrain {

namespace {

#if defined(__linux__)
// /proc/PID/stat as its fields from the state on ("S", ppid, ...): field N of proc(5) is
// fields[N - 3]. The name before them, in parentheses, may hold spaces and parentheses, so the
// fields start after the last ')'. Empty where the process is gone (or hidden).
std::vector<std::string> stat_fields(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return {};
  const auto close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

constexpr std::size_t kStateField = 0;        // proc(5) field 3
constexpr std::size_t kUserTimeField = 11;    // field 14, utime (ticks)
constexpr std::size_t kSystemTimeField = 12;  // field 15, stime (ticks)
constexpr std::size_t kStartField = 19;       // field 22, starttime (ticks after boot)

std::uint64_t field_number(const std::vector<std::string>& fields, std::size_t i) {
  if (i >= fields.size()) return 0;
  std::uint64_t value = 0;
  const std::string& text = fields[i];
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() ? value : 0;
}

// The kernel function the process waits in, where the kernel names it ("0" or nothing where it
// hides addresses from this user).
std::string wait_channel(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/wchan");
  std::string name;
  in >> name;
  return name == "0" ? "" : name;
}
#endif

#if defined(_WIN32)
// A process handle for reading its times and waiting on it, closed when it goes.
struct ProcessHandle {
  explicit ProcessHandle(std::int64_t pid)
      : handle(::OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION | SYNCHRONIZE, FALSE,
                             static_cast<DWORD>(pid))) {}
  ~ProcessHandle() {
    if (handle != nullptr) ::CloseHandle(handle);
  }
  ProcessHandle(const ProcessHandle&) = delete;
  ProcessHandle& operator=(const ProcessHandle&) = delete;
  bool ended() const { return ::WaitForSingleObject(handle, 0) == WAIT_OBJECT_0; }
  HANDLE handle;
};

std::uint64_t filetime_value(const FILETIME& time) {
  return (static_cast<std::uint64_t>(time.dwHighDateTime) << 32) | time.dwLowDateTime;
}

// When the process was created and the CPU time it has used (kernel and user), both in 100 ns
// units; nullopt where the system does not say.
struct ProcessTimes {
  std::uint64_t created = 0;
  std::uint64_t cpu = 0;
};
std::optional<ProcessTimes> times_of(HANDLE process) {
  FILETIME created{}, exited{}, kernel{}, user{};
  if (::GetProcessTimes(process, &created, &exited, &kernel, &user) == 0) return std::nullopt;
  return ProcessTimes{filetime_value(created), filetime_value(kernel) + filetime_value(user)};
}

// Whether another process's CPU time can be read here: Wine's ntdll (which exports
// wine_get_version) gives a constant for any process but the caller.
bool cpu_time_of_others_told() {
  const HMODULE ntdll = ::GetModuleHandleW(L"ntdll.dll");
  return ntdll == nullptr || ::GetProcAddress(ntdll, "wine_get_version") == nullptr;
}
#endif

#if defined(__linux__) || defined(_WIN32)
// Sleeps `window`, the bound of a watch, between two readings of a process's CPU time; the
// seconds that passed.
double watch_for(std::chrono::milliseconds window) {
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(window);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A live process that used `share` of one CPU while watched.
ProcessState alive_using(double share) {
  ProcessState state;
  state.cpu_percent = static_cast<int>(share * 100 + 0.5);
  state.kind = share >= 0.5   ? ProcessState::Kind::running
               : share < 0.05 ? ProcessState::Kind::idle
                              : ProcessState::Kind::alive;
  return state;
}
#endif

}  // namespace

std::int64_t current_process_id() {
#if defined(_WIN32)
  return _getpid();
#else
  return static_cast<std::int64_t>(::getpid());
#endif
}

std::int64_t current_user_id() {
#if defined(_WIN32)
  return -1;
#else
  return static_cast<std::int64_t>(::getuid());
#endif
}

std::string process_state_letter(std::int64_t pid) {
#if defined(__linux__)
  if (pid <= 0) return "";
  const std::vector<std::string> fields = stat_fields(std::to_string(pid));
  return fields.empty() ? "" : fields[kStateField];
#else
  (void)pid;
  return "";
#endif
}

bool process_alive(std::int64_t pid) {
  if (pid <= 0) return false;
#if defined(_WIN32)
  const ProcessHandle process(pid);
  // Only "no such process" says it is gone; denied access says it is there.
  if (process.handle == nullptr) return ::GetLastError() != ERROR_INVALID_PARAMETER;
  return !process.ended();
#else
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // Where /proc cannot be read (not Linux, or hidden from this user) kill() said enough.
  const std::string letter = process_state_letter(pid);
  return letter != "Z" && letter != "X" && letter != "x";
#endif
}

std::uint64_t process_start_ticks(std::int64_t pid) {
#if defined(__linux__)
  return pid > 0 ? field_number(stat_fields(std::to_string(pid)), kStartField) : 0;
#elif defined(_WIN32)
  if (pid <= 0) return 0;
  const ProcessHandle process(pid);
  if (process.handle == nullptr) return 0;
  const auto times = times_of(process.handle);
  return times ? times->created : 0;
#else
  (void)pid;
  return 0;
#endif
}

std::optional<ProcessState> watch_process(std::int64_t pid, std::uint64_t started,
                                          std::chrono::milliseconds window) {
#if defined(__linux__)
  if (pid <= 0 || started == 0) return std::nullopt;
  const std::string id = std::to_string(pid);
  ProcessState state;
  // Gone, or another process that was given its id since.
  const auto gone = [&](const std::vector<std::string>& fields) {
    return fields.empty() || field_number(fields, kStartField) != started;
  };
  const std::vector<std::string> first = stat_fields(id);
  if (gone(first)) return state;
  const double watched = watch_for(window);
  const std::vector<std::string> second = stat_fields(id);
  if (gone(second)) return state;
  const std::string& letter = second[kStateField];
  if (letter == "Z" || letter == "X" || letter == "x") return state;  // not yet reaped
  if (letter == "T") {
    state.kind = ProcessState::Kind::stopped;
    return state;
  }
  if (letter == "t") {
    state.kind = ProcessState::Kind::traced;
    return state;
  }
  if (letter == "D") {
    state.kind = ProcessState::Kind::blocked;
    state.wait_channel = wait_channel(id);
    return state;
  }
  const auto busy = [](const std::vector<std::string>& fields) {
    return field_number(fields, kUserTimeField) + field_number(fields, kSystemTimeField);
  };
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  const std::uint64_t used = busy(second) >= busy(first) ? busy(second) - busy(first) : 0;
  return alive_using(ticks_per_second > 0 && watched > 0
                         ? static_cast<double>(used) / static_cast<double>(ticks_per_second) /
                               watched
                         : 0.0);
#elif defined(_WIN32)
  // Windows tells a process that ended from one that runs, and its CPU time; a suspended one
  // (a debugger, a suspend of every thread) it does not tell apart from an idle one.
  if (pid <= 0 || started == 0) return std::nullopt;
  ProcessState state;
  const ProcessHandle process(pid);
  if (process.handle == nullptr) {
    // No such process any more; another reason (access) says nothing.
    if (::GetLastError() == ERROR_INVALID_PARAMETER) return state;
    return std::nullopt;
  }
  const auto first = times_of(process.handle);
  if (!first || first->created != started || process.ended()) return state;
  const double watched = watch_for(window);
  if (process.ended()) return state;
  const auto second = times_of(process.handle);
  static const bool told = cpu_time_of_others_told();
  if (!second || watched <= 0 || (!told && pid != current_process_id())) {
    state.kind = ProcessState::Kind::alive;
    state.cpu_percent = -1;
    return state;
  }
  const std::uint64_t used = second->cpu >= first->cpu ? second->cpu - first->cpu : 0;
  return alive_using(static_cast<double>(used) / 1e7 / watched);  // FILETIME: 100 ns units
#else
  (void)pid;
  (void)started;
  (void)window;
  return std::nullopt;
#endif
}

std::string describe_process_state(const ProcessState& state, std::int64_t pid, bool resume_hint) {
  const std::string percent = std::to_string(state.cpu_percent) + "%";
  switch (state.kind) {
    case ProcessState::Kind::ended:
#if defined(_WIN32)
      return "has ended without saying why: killed (Task Manager, taskkill), or crashed (the "
             "Event Viewer's Application log may say which)";
#else
      return "has ended without saying why: a signal such as SIGKILL, or the kernel's "
             "out-of-memory killer (its engine's log or `dmesg` may say which)";
#endif
    case ProcessState::Kind::stopped:
      return "is stopped (SIGSTOP or SIGTSTP)" +
             (resume_hint ? ": `kill -CONT " + std::to_string(pid) + "` resumes it"
                          : std::string());
    case ProcessState::Kind::traced:
      return "is stopped by a debugger or tracer";
    case ProcessState::Kind::blocked:
      return "is blocked in the kernel, uninterruptibly (disk or network file system I/O, or a "
             "device)" +
             (state.wait_channel.empty() ? std::string() : ", in " + state.wait_channel);
    case ProcessState::Kind::running:
      return "is running, using " + percent +
             " of a CPU: busy with something else (a long computation, a loop)";
    case ProcessState::Kind::idle:
      return "is alive but idle (" + percent +
             " of a CPU): waiting on something else (another collective, a lock, its data)";
    case ProcessState::Kind::alive:
      break;
  }
  if (state.cpu_percent < 0) return "is alive (this system does not say its CPU time)";
  return "is alive, using " + percent + " of a CPU";
}

}  // namespace partrain
