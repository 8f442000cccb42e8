// defines: host_identity() — a text that two processes share exactly when they run on one
// host and may map the same shared memory — kernel_identity(), pid_namespace(), cpu_affinity(),
// shm_room(), steady_clock_identity(), and ProcessMark with this_process(),
// encode_process_mark(), decode_process_mark() and look_at_process(): one process as the others
// on its machine can find it and see what it does. Ranks compare them through the store
// (exchange_host_layout(), placement.h; the peer transport's addresses).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/process_state.h"

namespace partrain::comm {

// The host name, and on Linux the kernel's boot id and the network namespace: two network
// namespaces of one kernel are two hosts to partrain (as the multi-node tests make them),
// even though they could share memory. The namespace is the calling thread's, the one its
// sockets use (a thread may have entered another one than its process started in).
std::string host_identity();

// A text that two processes share exactly when they run on one kernel, whatever their
// namespaces or containers: on Linux the kernel's boot id; empty where the system does not
// say. Traffic between two such processes never leaves the machine (loopback, veth, bridge).
std::string kernel_identity();

// The process-id namespace of this process (the inode of /proc/self/ns/pid): two processes of
// one kernel whose pids mean the same share it. 0 where the system does not say.
std::uint64_t pid_namespace();

// The CPUs the calling thread may run on, as ranges in ascending order ("0-3,8"): what ranks of
// one host compare to tell whether they share cores (HostLayout::host_cpus, placement.h). Empty
// where the system does not say. A CPU quota (a cgroup's cpu.max, `docker run --cpus`) limits
// time, not CPUs, and does not show here.
std::string cpu_affinity();

// The bytes free where this host keeps shared-memory regions (/dev/shm, where the shm and
// hierarchical backends make theirs) for an unprivileged process: what ranks of one host
// compare with the region they would need (HostLayout::host_shm_room, placement.h).
// kShmRoomUnknown where the system does not say (outside Linux, or no /dev/shm).
inline constexpr std::uint64_t kShmRoomUnknown = ~std::uint64_t{0};
std::uint64_t shm_room();

// A text that two processes share when their steady clocks read the same: on Linux the
// kernel's boot id and the time namespace (CLOCK_MONOTONIC is one clock for a whole boot,
// network namespaces included, unless a time namespace offsets it); elsewhere the host name.
std::string steady_clock_identity();

// One process as others on its machine can find it: its id, when it started (a later process
// given the same id is not it), and what makes ids comparable (the kernel's boot, the process-id
// namespace), with the user it runs as (another user's processes may be hidden from this one).
struct ProcessMark {
  std::int64_t pid = 0;
  std::uint64_t started = 0;  // process_start_ticks(); 0: not known
  // kernel_identity() and pid_namespace(); on Windows the host and its boot time, and 1 (one
  // process-id space). Empty, 0: not known.
  std::string kernel;
  std::uint64_t pid_space = 0;
  std::int64_t user = -1;
  bool operator==(const ProcessMark&) const = default;
};

// This process's mark.
ProcessMark this_process();

// The mark as published ("pid=P started=S kernel=K pidns=N uid=U") and back; nullopt for a
// text that is not one.
std::string encode_process_mark(const ProcessMark& mark);
std::optional<ProcessMark> decode_process_mark(std::string_view text);

// The state of the process `mark` names (common/process_state.h), watched for `window` where it
// is alive; nullopt where it runs on another machine or in another process-id space, or this
// system does not say (neither Linux nor Windows).
std::optional<ProcessState> watch_marked_process(
    const ProcessMark& mark, std::chrono::milliseconds window = kProcessWatchWindow);

// What this machine shows of the process `mark` names (watch_marked_process()), as a phrase
// that follows "rank R (pid P, this machine) ": "is stopped ...", "has ended ...", "is blocked in
// the kernel ...", "is running, using 97% of a CPU ...", "is alive but idle ...". nullopt where
// the process runs on another machine or in another process-id space, or this system does not
// say (neither Linux nor Windows). Watches a live process for `window`.
std::optional<std::string> look_at_process(const ProcessMark& mark,
                                           std::chrono::milliseconds window = kProcessWatchWindow);

}  // namespace partrain::comm
