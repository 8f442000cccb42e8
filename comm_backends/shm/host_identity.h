// defines: host_identity() — a text that two processes share exactly when they run on one
// host and may map the same shared memory — and rank_on_another_host(), which compares it
// across the ranks of a run through the store.
#pragma once

#include <optional>
#include <string>

namespace partrain::comm {

class Store;

// The host name, and on Linux the kernel's boot id and the network namespace: two network
// namespaces of one kernel are two hosts to partrain (as the multi-node tests make them),
// even though they could share memory.
std::string host_identity();

struct ForeignRank {
  int rank = 0;
  std::string identity;  // that rank's host_identity()
};

// Publishes this rank's identity under prefix + rank, reads every other rank's, and returns
// the first rank whose host is not this one (nothing when all share it).
std::optional<ForeignRank> rank_on_another_host(Store& store, const std::string& prefix, int rank,
                                                int size);

}  // namespace partrain::comm
