// defines: may_read_own_memory(), siblings_may_read_each_other() — whether this system lets
// the shm backend's single-copy allgather run (Note [Reading another rank's memory] in
// comm_backends/shm/shm_collectives.cpp), so that its tests skip rather than fail where it
// does not (Yama's ptrace_scope 1, Ubuntu's default, for processes that are not each other's
// ancestors; a seccomp filter that refuses process_vm_readv).
#pragma once

#if defined(__linux__)
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

namespace partrain::testing {

inline std::uint64_t cross_memory_word = 0x5eed5eed5eed5eedull;

// Whether process `pid` may be read at cross_memory_word's address by the caller.
inline bool read_word_of(pid_t pid) {
  std::uint64_t value = 0;
  iovec here{&value, sizeof value}, there{&cross_memory_word, sizeof value};
  return ::process_vm_readv(pid, &here, 1, &there, 1, 0) == sizeof value &&
         value == cross_memory_word;
}

// Threads of one process, reading it through the system call.
inline bool may_read_own_memory() { return read_word_of(::getpid()); }

// Two processes with a common parent, as the ranks a launcher starts: one reads the other.
inline bool siblings_may_read_each_other() {
  int hold[2];
  if (::pipe(hold) != 0) return false;
  const pid_t target = ::fork();
  if (target == 0) {  // waits until the parent closes the pipe
    ::close(hold[1]);
    char c;
    while (::read(hold[0], &c, 1) > 0) {
    }
    ::_exit(0);
  }
  ::close(hold[0]);
  int status = 1;
  if (target > 0) {
    const pid_t reader = ::fork();
    if (reader == 0) ::_exit(read_word_of(target) ? 0 : 1);
    if (reader > 0) ::waitpid(reader, &status, 0);
  }
  ::close(hold[1]);
  if (target > 0) ::waitpid(target, nullptr, 0);
  return target > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace partrain::testing
#endif
