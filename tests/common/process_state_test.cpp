// What this machine shows of a process (common/process_state.h): real child processes that are
// stopped, held by a tracer, blocked in the kernel, killed (reaped and not), spinning or
// sleeping, and how each is said.
#include "common/process_state.h"

#include <gtest/gtest.h>

#if defined(__linux__)
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>
#endif

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#include <string>
#endif

namespace partrain {
namespace {

TEST(ProcessState, EachStateIsSaidInOnePhrase) {
  ProcessState state;
  EXPECT_TRUE(describe_process_state(state, 7).starts_with("has ended without saying why"));
  state.kind = ProcessState::Kind::stopped;
  EXPECT_EQ(describe_process_state(state, 7),
            "is stopped (SIGSTOP or SIGTSTP): `kill -CONT 7` resumes it");
  EXPECT_EQ(describe_process_state(state, 7, false), "is stopped (SIGSTOP or SIGTSTP)");
  state.kind = ProcessState::Kind::blocked;
  state.wait_channel = "rpc_wait_bit_killable";
  EXPECT_EQ(describe_process_state(state, 7),
            "is blocked in the kernel, uninterruptibly (disk or network file system I/O, or a "
            "device), in rpc_wait_bit_killable");
  state.kind = ProcessState::Kind::running;
  state.cpu_percent = 97;
  EXPECT_TRUE(describe_process_state(state, 7).starts_with("is running, using 97% of a CPU"));
  state.kind = ProcessState::Kind::idle;
  state.cpu_percent = 0;
  EXPECT_TRUE(describe_process_state(state, 7).starts_with("is alive but idle (0% of a CPU)"));
  state.kind = ProcessState::Kind::alive;
  state.cpu_percent = -1;  // a system that does not say
  EXPECT_EQ(describe_process_state(state, 7), "is alive (this system does not say its CPU time)");
}

#if defined(__linux__)

// What a child blocked in the kernel waits on: its own child, made with CLONE_VFORK, which
// sleeps (30 s at most, and no longer than its parent lives).
int hold_the_parent(void*) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const timespec tenth{0, 100000000};
  for (int i = 0; i < 300; ++i) ::nanosleep(&tenth, nullptr);
  ::_exit(0);
}

// A child that does `what` until killed: "sleep" (idle), "spin" (busy), "vfork" (blocked in the
// kernel: a parent waits uninterruptibly, though killably, until its vfork child execs or exits).
pid_t start_child(const std::string& what) {
  const pid_t pid = ::fork();
  if (pid == 0 && what == "vfork") {
    std::vector<char> stack(1 << 16);
    ::clone(hold_the_parent, stack.data() + stack.size(), CLONE_VM | CLONE_VFORK | SIGCHLD,
            nullptr);
    ::_exit(0);
  }
  if (pid == 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    volatile std::uint64_t sum = 0;
    while (std::chrono::steady_clock::now() < end) {  // bounded: a minute, if never killed
      if (what == "sleep") {
        ::usleep(100000);
      } else {
        for (int i = 0; i < 1000000; ++i) sum = sum + static_cast<std::uint64_t>(i);
      }
    }
    ::_exit(0);
  }
  return pid;
}

struct Child {
  explicit Child(const std::string& what)
      : pid(start_child(what)), started(process_start_ticks(pid)) {}
  ~Child() {
    if (!reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  pid_t pid;
  std::uint64_t started;
  bool reaped = false;
};

ProcessState::Kind kind_of(const Child& child) {
  const auto state = watch_process(child.pid, child.started);
  return state ? state->kind : ProcessState::Kind::alive;
}

TEST(ProcessState, AChildsStartIsKnownAndNoProcessHasNone) {
  Child child("sleep");
  EXPECT_GT(child.started, 0u);
  EXPECT_EQ(current_process_id(), ::getpid());
  EXPECT_EQ(process_state_letter(0), "");
  EXPECT_EQ(process_start_ticks(0), 0u);
  EXPECT_FALSE(watch_process(child.pid, 0).has_value());  // no start time: not known
}

TEST(ProcessState, AStoppedChildIsStopped) {
  Child child("sleep");
  ASSERT_EQ(::kill(child.pid, SIGSTOP), 0);
  ASSERT_EQ(::waitpid(child.pid, nullptr, WUNTRACED), child.pid);  // it is stopped now
  EXPECT_EQ(kind_of(child), ProcessState::Kind::stopped);
}

TEST(ProcessState, AChildStoppedByItsTracerIsHeldByADebugger) {
  Child child("sleep");
  if (::ptrace(PTRACE_ATTACH, child.pid, nullptr, nullptr) != 0) {
    GTEST_SKIP() << "this system refuses ptrace: " << std::strerror(errno);
  }
  ASSERT_EQ(::waitpid(child.pid, nullptr, 0), child.pid);  // in its tracing stop now
  EXPECT_EQ(process_state_letter(child.pid), "t");
  const auto state = watch_process(child.pid, child.started);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->kind, ProcessState::Kind::traced);
  EXPECT_EQ(describe_process_state(*state, child.pid), "is stopped by a debugger or tracer");
}

TEST(ProcessState, AChildWaitingInTheKernelIsBlocked) {
  Child child("vfork");
  // Until its vfork child runs: bounded, a second at most.
  for (int i = 0; i < 200 && process_state_letter(child.pid) != "D"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto state = watch_process(child.pid, child.started);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->kind, ProcessState::Kind::blocked);
  EXPECT_TRUE(describe_process_state(*state, child.pid)
                  .starts_with("is blocked in the kernel, uninterruptibly"))
      << describe_process_state(*state, child.pid);
}

TEST(ProcessState, AKilledChildHasEndedReapedOrNot) {
  Child child("sleep");
  EXPECT_TRUE(process_alive(child.pid));
  ASSERT_EQ(::kill(child.pid, SIGKILL), 0);
  // Not yet reaped: a zombie, which has ended all the same. Bounded: a second at most.
  for (int i = 0; i < 200 && process_state_letter(child.pid) != "Z"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(process_state_letter(child.pid), "Z");
  EXPECT_EQ(kind_of(child), ProcessState::Kind::ended);
  EXPECT_FALSE(process_alive(child.pid));
  ASSERT_EQ(::waitpid(child.pid, nullptr, 0), child.pid);
  child.reaped = true;
  EXPECT_EQ(kind_of(child), ProcessState::Kind::ended);
  EXPECT_FALSE(process_alive(child.pid));
}

// A process this one may not signal (EPERM) is alive all the same: here a child that became
// another user looks at init, which is root's.
TEST(ProcessState, AProcessOfAnotherUserIsAlive) {
  if (::geteuid() != 0) GTEST_SKIP() << "becoming another user needs root";
  const pid_t helper = ::fork();
  if (helper == 0) {
    if (::setuid(65534) != 0) ::_exit(3);
    const bool denied = ::kill(1, 0) != 0 && errno == EPERM;
    ::_exit(!denied ? 4 : process_alive(1) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(helper, &status, 0), helper);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "this system lets no process become nobody";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: init said gone; 4: not denied";
  EXPECT_TRUE(process_alive(current_process_id()));
  EXPECT_FALSE(process_alive(0));
}

TEST(ProcessState, AnotherProcessGivenTheSameIdIsNotTheOne) {
  Child child("sleep");
  const auto state = watch_process(child.pid, child.started + 1);
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->kind, ProcessState::Kind::ended);
}

TEST(ProcessState, BusyAndIdleChildrenAreToldApart) {
  Child busy("spin");
  Child idle("sleep");
  // Two cores here, and a test beside this one may hold them: a spinning child may get less
  // than the half of a CPU that "running" takes, but never as little as an idle one.
  const auto busy_state = watch_process(busy.pid, busy.started);
  const auto idle_state = watch_process(idle.pid, idle.started);
  ASSERT_TRUE(busy_state && idle_state);
  EXPECT_TRUE(busy_state->kind == ProcessState::Kind::running ||
              busy_state->kind == ProcessState::Kind::alive)
      << describe_process_state(*busy_state, busy.pid);
  EXPECT_GE(busy_state->cpu_percent, 5);
  EXPECT_EQ(idle_state->kind, ProcessState::Kind::idle)
      << describe_process_state(*idle_state, idle.pid);
}

#endif

#if defined(_WIN32)

// A child that keeps a CPU busy: this test program itself, running one quick test over and over
// (its output to NUL), until it is terminated.
struct BusyChild {
  BusyChild() {
    wchar_t self[MAX_PATH] = {};
    ::GetModuleFileNameW(nullptr, self, MAX_PATH);
    std::wstring command = L"\"" + std::wstring(self) +
                           L"\" --gtest_filter=ProcessState.EachStateIsSaidInOnePhrase "
                           L"--gtest_repeat=-1";
    SECURITY_ATTRIBUTES inherit{sizeof inherit, nullptr, TRUE};
    nul =
        ::CreateFileW(L"NUL", GENERIC_WRITE, FILE_SHARE_WRITE, &inherit, OPEN_EXISTING, 0, nullptr);
    STARTUPINFOW startup{};
    startup.cb = sizeof startup;
    startup.dwFlags = STARTF_USESTDHANDLES;
    startup.hStdOutput = startup.hStdError = nul;
    created = ::CreateProcessW(nullptr, command.data(), nullptr, nullptr, TRUE, 0, nullptr, nullptr,
                               &startup, &info) != 0;
  }
  ~BusyChild() {
    if (created) {
      ::TerminateProcess(info.hProcess, 9);
      ::WaitForSingleObject(info.hProcess, 10000);
      ::CloseHandle(info.hThread);
      ::CloseHandle(info.hProcess);
    }
    if (nul != INVALID_HANDLE_VALUE) ::CloseHandle(nul);
  }
  HANDLE nul = INVALID_HANDLE_VALUE;
  PROCESS_INFORMATION info{};
  bool created = false;
};

TEST(ProcessState, ABusyChildIsAliveAndATerminatedOneHasEnded) {
  BusyChild child;
  ASSERT_TRUE(child.created) << "CreateProcessW failed: " << ::GetLastError();
  const std::int64_t pid = child.info.dwProcessId;
  const std::uint64_t started = process_start_ticks(pid);
  ASSERT_GT(started, 0u);
  EXPECT_TRUE(process_alive(pid));
  const auto alive = watch_process(pid, started);
  ASSERT_TRUE(alive.has_value());
  // Running where the system says its CPU time; Wine does not say it for another process.
  EXPECT_TRUE(alive->kind == ProcessState::Kind::running ||
              (alive->kind == ProcessState::Kind::alive && alive->cpu_percent == -1) ||
              (alive->kind == ProcessState::Kind::alive && alive->cpu_percent >= 5))
      << describe_process_state(*alive, pid);
  // Another process given its id since is not it.
  const auto other = watch_process(pid, started + 1);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->kind, ProcessState::Kind::ended);

  ASSERT_NE(::TerminateProcess(child.info.hProcess, 9), 0);
  ASSERT_EQ(::WaitForSingleObject(child.info.hProcess, 10000), WAIT_OBJECT_0);
  EXPECT_FALSE(process_alive(pid));
  const auto ended = watch_process(pid, started);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->kind, ProcessState::Kind::ended);
  EXPECT_TRUE(describe_process_state(*ended, pid).starts_with("has ended without saying why"));
}

#endif

}  // namespace
}  // namespace partrain
