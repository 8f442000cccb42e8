// defines: ProcessMark, this_process(), publish_process_on_join(), look_at_process() and
// look_at_rank_process() — what a rank that lost another can see of that rank's process when it
// runs on the same machine: ended, stopped, blocked in the kernel, busy, or idle.
//
// A rank that stops on an error of its own says why (failure_trace.h). One that was killed, or
// froze, says nothing; the others know only that it went quiet. Where they share its machine
// (one kernel, one process-id space: the common case of several GPUs in one box, and of the
// network-namespace hosts of the tests) they can look at the process itself, as `ps` would.
// So every rank publishes its process at join (process_key()), and the rank that names a
// silent one adds what it sees: "rank 1 (pid 4242, this machine) is stopped (SIGSTOP or
// SIGTSTP): kill -CONT 4242 resumes it". Across machines, and outside Linux, nothing is added.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/process_state.h"

namespace partrain::comm {

class Store;
struct StoreOptions;

// One process as others on its machine can find it: its id, when it started (a later process
// given the same id is not it), and what makes ids comparable (the kernel's boot, the process-id
// namespace), with the user it runs as (another user's processes may be hidden from this one).
struct ProcessMark {
  std::int64_t pid = 0;
  std::uint64_t started = 0;  // clock ticks after boot (/proc/PID/stat); 0: not known
  std::string kernel;         // kernel_identity(); empty: not known
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

// Where rank `rank` publishes its mark.
std::string process_key(int rank);

// Has the store that `options` open publish this process's mark as rank `rank`'s as it joins
// (StoreOptions::join_key: over tcp, in the hello itself, no request of its own).
void publish_process_on_join(StoreOptions& options, int rank);

// What this machine shows of the process `mark` names (common/process_state.h), as a phrase
// that follows "rank R (pid P, this machine) ": "is stopped ...", "has ended ...", "is blocked in
// the kernel ...", "is running, using 97% of a CPU ...", "is alive but idle ...". nullopt where
// the process runs on another machine or in another process-id space, or this system does not
// say (not Linux). Watches a live process for `window`.
std::optional<std::string> look_at_process(const ProcessMark& mark,
                                           std::chrono::milliseconds window = kProcessWatchWindow);

// The sentence for rank `rank`, from its published mark: "rank R (pid P, this machine) is
// stopped ...". nullopt where it published none within `bound`, or look_at_process() cannot
// say. Never throws.
std::optional<std::string> look_at_rank_process(Store& store, int rank,
                                                std::chrono::milliseconds bound);

}  // namespace partrain::comm
