// defines: ProcessState, current_process_id(), current_user_id(), process_state_letter(),
// process_alive(), process_start_ticks(), watch_process() and describe_process_state() —
// what this machine shows of a process that has gone quiet, as `ps` would: ended, stopped,
// held by a debugger, blocked in the kernel, busy, or idle. A rank that lost another rank of its
// machine says it (comm_backends/backends/peer_process.h), and so does a launcher about to kill
// a worker that wrote nothing for too long (cli/launcher.cpp). Linux reads /proc/PID/stat and
// tells every state; Windows (OpenProcess, GetProcessTimes) tells ended, busy and idle, not
// stopped; elsewhere nothing is known.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace partrain {

struct ProcessState {
  enum class Kind {
    ended,    // gone, a zombie, or another process given its id since
    stopped,  // SIGSTOP, SIGTSTP
    traced,   // stopped by a debugger or tracer
    blocked,  // in an uninterruptible wait in the kernel
    running,  // used at least half a CPU while watched
    idle,     // used under 5 % of a CPU while watched
    alive     // in between
  };
  Kind kind = Kind::ended;
  int cpu_percent = 0;       // of one CPU, while watched (running, idle, alive); -1: not told
  std::string wait_channel;  // blocked: the kernel function it waits in, where the kernel says
};

// This process's id (getpid(); _getpid() on Windows).
std::int64_t current_process_id();

// The user this process runs as (getuid()); -1 where the system has no such number (Windows).
std::int64_t current_user_id();

// The state letter of /proc/PID/stat ("R", "S", "D", "T", "Z", ...); empty where it cannot be
// read (no such process, hidden from this user, or not Linux).
std::string process_state_letter(std::int64_t pid);

// Whether process `pid` exists and has not ended: a zombie nobody has reaped yet has ended. A
// process this one may not look at (another user's: EPERM on POSIX, ERROR_ACCESS_DENIED from
// Windows' OpenProcess) exists. False for pid <= 0.
bool process_alive(std::int64_t pid);

// When process `pid` started: on Linux in clock ticks after boot (field 22 of /proc/PID/stat),
// on Windows its creation time (100 ns units); 0 where it is not known (no such process, or
// another system). With the pid it names one process for good.
std::uint64_t process_start_ticks(std::int64_t pid);

// How long watch_process() watches a live process's CPU time to tell busy from idle.
inline constexpr std::chrono::milliseconds kProcessWatchWindow{200};

// The state of the process `pid` that started at `started` (process_start_ticks()), watched for
// `window` (one sleep, the bound of this call) when it is alive. nullopt where this system does
// not say (neither Linux nor Windows, or `started` is 0).
std::optional<ProcessState> watch_process(std::int64_t pid, std::uint64_t started,
                                          std::chrono::milliseconds window = kProcessWatchWindow);

// The state as a phrase that follows a name ("rank 1 (pid 4242, this machine) "): "is stopped
// (SIGSTOP or SIGTSTP)", "has ended without saying why: ...", "is blocked in the kernel, ...",
// "is running, using 97% of a CPU: busy with something else (...)", "is alive but idle (0% of a
// CPU): waiting on something else (...)", "is alive, using 20% of a CPU". A stopped process's
// phrase ends with how to resume it where `resume_hint` is set: ": `kill -CONT P` resumes it".
std::string describe_process_state(const ProcessState& state, std::int64_t pid,
                                   bool resume_hint = true);

}  // namespace partrain
