// defines: process_key(), publish_process_on_join() and look_at_rank_process() — what a rank
// that lost another can see of that rank's process when it runs on the same machine: ended,
// stopped, blocked in the kernel, busy, or idle.
//
// A rank that stops on an error of its own says why (failure_trace.h). One that was killed, or
// froze, says nothing; the others know only that it went quiet. Where they share its machine
// (one kernel, one process-id space: the common case of several GPUs in one box, and of the
// network-namespace hosts of the tests) they can look at the process itself, as `ps` would.
// So every rank publishes its process at join (process_key()), and the rank that names a
// silent one adds what it sees: "rank 1 (pid 4242, this machine) is stopped (SIGSTOP or
// SIGTSTP): kill -CONT 4242 resumes it". Rank 0 serves the tcp store, so where it is the one
// lost its mark may not be readable any more: its server's own mark, which every client got at
// its hello (Store::server_process()), stands in. Across machines, and on systems other than
// Linux and Windows (which tells ended, busy and idle, not stopped), nothing is added.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "comm_backends/shm/host_identity.h"

namespace partrain::comm {

class Store;
struct StoreOptions;

// Where rank `rank` publishes its mark.
std::string process_key(int rank);

// Has the store that `options` open publish this process's mark as rank `rank`'s as it joins
// (StoreOptions::join_key: over tcp, in the hello itself, no request of its own).
void publish_process_on_join(StoreOptions& options, int rank);

// The sentence for rank `rank`, from its published mark, or where the store cannot give that
// within `bound` and its server said it is that rank, from the server's: "rank R (pid P, this
// machine) is stopped ...". nullopt where neither is known, or look_at_process() cannot say.
// Never throws.
std::optional<std::string> look_at_rank_process(Store& store, int rank,
                                                std::chrono::milliseconds bound);

// Where the store stopped answering and its server said it is a rank of this machine whose
// process has ended, or is stopped (SIGSTOP, or by a debugger): that rank, with the sentence for
// it ("rank 0 (pid P, this machine) has exited, and the store it served with it"). The rank that
// serves the store is the one lost first where its store went with it: the ranks that lost it
// fail next, and a rank that lost one of those could otherwise follow the blame no further.
// nullopt otherwise. Never throws.
struct ServingRankSeen {
  int rank = -1;
  std::string sentence;
};
std::optional<ServingRankSeen> serving_rank_gone(const Store& store);

}  // namespace partrain::comm
