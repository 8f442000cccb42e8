// defines: host_identity() — a text that two processes share exactly when they run on one
// host and may map the same shared memory — exchange_host_identities() and
// rank_on_another_host(), which compare it across the ranks of a run through the store, and
// HostLayout / group_by_host(), the ranks of a run grouped by host.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace partrain::comm {

class Store;

// The host name, and on Linux the kernel's boot id and the network namespace: two network
// namespaces of one kernel are two hosts to partrain (as the multi-node tests make them),
// even though they could share memory. The namespace is the calling thread's, the one its
// sockets use (a thread may have entered another one than its process started in).
std::string host_identity();

// Publishes this rank's identity under prefix + rank and returns every rank's, in rank order.
std::vector<std::string> exchange_host_identities(Store& store, const std::string& prefix, int rank,
                                                  int size);

struct HostLayout {
  // The ranks of each host, ascending; hosts in the order of their lowest rank, so that host
  // 0 holds rank 0 and the first rank of each host is the lowest there.
  std::vector<std::vector<int>> hosts;
  std::vector<int> host_of;  // rank -> its index in `hosts`
};
HostLayout group_by_host(const std::vector<std::string>& identities);

struct ForeignRank {
  int rank = 0;
  std::string identity;  // that rank's host_identity()
};

// Publishes this rank's identity under prefix + rank, reads every other rank's, and returns
// the first rank whose host is not this one (nothing when all share it).
std::optional<ForeignRank> rank_on_another_host(Store& store, const std::string& prefix, int rank,
                                                int size);

}  // namespace partrain::comm
