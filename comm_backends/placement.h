// defines: HostLayout, group_by_host(), exchange_host_layout(), layout_on_this_host(),
// RankHosts and Placement — where the ranks of a group run (which of them share a host, and
// whether their buffers are in CUDA or CPU memory): what `auto` picks a backend by and what
// the shm and hierarchical backends build on. A group learns it in one exchange through the
// store, at most.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm_backends/buffer.h"
#include "comm_backends/shm/host_identity.h"

namespace partrain::comm {

class Store;

// Kept as runs of consecutive ranks on one host, so that what each rank holds and decodes
// grows with the runs (one for a world on one host, one a host for the usual placement),
// not with the world: every rank of a large job learns it at once.
struct HostLayout {
  struct Run {
    int first = 0;  // its lowest rank
    int count = 0;  // at least 1
    int host = 0;   // index in `identities`
    bool operator==(const Run&) const = default;
  };
  // In rank order from rank 0, without gaps; neighbours are on different hosts. Hosts are
  // numbered in the order of their lowest rank, so that host 0 holds rank 0.
  std::vector<Run> runs;
  std::vector<std::string> identities;  // host -> its host_identity() (shm/host_identity.h)
  std::vector<int> host_sizes;          // host -> the number of its ranks
  // host -> how many distinct CPUs its ranks may run on, all together (the union of their
  // cpu_affinity()); 0 where not known.
  std::vector<int> host_cpus;
  // host -> the bytes free for shared memory there (shm_room(), the least any of its ranks
  // saw); kShmRoomUnknown where none could say.
  std::vector<std::uint64_t> host_shm_room;

  int ranks() const { return runs.empty() ? 0 : runs.back().first + runs.back().count; }
  std::size_t host_count() const { return identities.size(); }
  int host_of(int rank) const;               // O(log runs)
  std::vector<int> members(int host) const;  // its ranks, ascending
  std::vector<int> host_of_each() const;     // rank -> host, for all ranks
  std::size_t largest_host() const;          // the number of ranks on the fullest host
  // Whether some host runs more ranks than the CPUs they may run on, so that its ranks take
  // turns on a core (what algorithm_choice.h's choice asks).
  bool shares_cores() const;
  // Whether host `host` does.
  bool shares_cores(int host) const;
  // host_shm_room[host], or kShmRoomUnknown where the layout does not hold it.
  std::uint64_t shm_room_of(std::size_t host) const {
    return host < host_shm_room.size() ? host_shm_room[host] : kShmRoomUnknown;
  }
  // Adds `count` ranks after the last, on host `host` (an existing index, or the next one
  // with `identity`).
  void append(int host, int count, const std::string& identity);
  bool operator==(const HostLayout&) const = default;
};

// Where one rank runs: its host_identity(), the CPUs it may run on (cpu_affinity(); empty: not
// known) and the room for shared memory there (shm_room()).
struct RankSite {
  std::string host;
  std::string cpus;
  std::uint64_t shm_room = kShmRoomUnknown;
};

// Ranks grouped by host, from each rank's host_identity() in rank order (host_cpus not known),
// or from each rank's site.
HostLayout group_by_host(const std::vector<std::string>& identities);
HostLayout group_by_host(const std::vector<RankSite>& sites);
// The number of distinct CPUs in lists such as cpu_affinity() writes ("0-3,8"), together; 0 if
// any list is empty or not such a list.
int distinct_cpus(const std::vector<std::string>& lists);

// Binding the ranks partrain starts on a host to cores of their own (Note [Binding ranks to
// cores] in placement.cpp).
//
// The cores of the CPUs this process may run on: cpu_affinity(), grouped by the hardware
// threads that share a core (/sys/devices/system/cpu/cpuN/topology/thread_siblings_list), each
// core's CPUs ascending, the cores in the order of their lowest CPU. A CPU whose core the
// system does not name is a core of its own. Empty where the affinity is not known, and
// outside Linux, where the launcher does not bind.
std::vector<std::vector<int>> allowed_cores();
// `cpus` grouped into cores: two CPUs are of one core when `siblings` gives the same list for
// both (an empty list: the CPU is a core of its own). Ordered as allowed_cores() orders them.
std::vector<std::vector<int>> group_into_cores(const std::vector<int>& cpus,
                                               const std::function<std::string(int cpu)>& siblings);
// The CPUs each of `ranks` ranks is bound to: rank i takes cores [i * C / ranks,
// (i + 1) * C / ranks) of the C `cores`, every hardware thread of a core going to one rank; with
// fewer cores than ranks, the hardware threads in the cores' order are divided so instead; with
// fewer hardware threads than ranks, rank i shares thread i * T / ranks of the T threads.
// Empty, for no binding, with one rank or no cores.
std::vector<std::vector<int>> bind_ranks(const std::vector<std::vector<int>>& cores, int ranks);
// Whether two ranks of such a binding share a CPU.
bool shares_cpus(const std::vector<std::vector<int>>& binding);

// Publishes this rank's site (host_identity() and cpu_affinity()) under prefix + rank and
// learns every rank's host from one value, prefix + "layout", that rank 0 publishes. The hosts are
// gathered in two levels: every `fan_in`-th rank collects its group's hosts into one value and rank
// 0 collects those, each with one Store::get_many, so the longest chain is rank 0's four requests
// on the tcp store (its own key, its group, the groups, the layout; a store without a get many of
// its own asks key by key: about 2*fan_in + 2*W/fan_in). About 2W + 2W/fan_in store requests for a
// world of W, where each rank reading every other's would be W*W. Waits up to the store's timeout
// (a CommError names the ranks that never published their host). A leader that finds a rank of
// another build sets why in place of its value, so that every rank waiting on it stops at once
// with that reason ("host layout: rank 0 stopped the exchange: rank 3 runs another build of
// partrain ...").
// A rank's answer never changes, so repeating a successful exchange under one prefix is harmless;
// after a failure, one under the same prefix fails the same way. One rank alone asks nothing of
// the store. `fan_in` 0 picks the default (kLayoutFanInMin, or sqrt(W) where that is larger);
// every rank must pass the same.
inline constexpr int kLayoutFanInMin = 64;
HostLayout exchange_host_layout(Store& store, const std::string& prefix, int rank, int size,
                                int fan_in = 0);
// A rank that stops before it took part in the exchange (it never published its host under
// `prefix`) publishes `finding` in place of every value the others would wait for from it, so
// that the exchange stops at once on every rank with that finding, as with a leader's; a rank
// that took part leaves it as it is. For the exchange of the default fan-in.
void stop_host_layout(Store& store, const std::string& prefix, int rank, int size,
                      const std::string& finding);
// The layout as rank 0 publishes it (hosts, then runs of ranks on one host), and back; a
// value that does not describe `ranks` ranks is a CommError.
std::vector<std::uint8_t> encode_host_layout(const HostLayout& layout);
HostLayout decode_host_layout(const std::vector<std::uint8_t>& bytes, int ranks);
inline constexpr const char* kHostLayoutPrefix = "comm/hosts/";  // the prefix partrain uses

// `ranks` ranks all on this host, as this process's CPUs, known without asking anyone (a probe
// of this machine).
HostLayout layout_on_this_host(int ranks);

// The hosts of a group's ranks: given, or learned through the store the first time they are
// asked for (exchange_host_layout()) and kept. Only what needs them asks (auto on the host
// backends, shm, hierarchical; asio-ring's choice at three ranks or more and its first call of
// more than a chunk by recursive doubling, halving or Rabenseifner), so the ranks of nccl or
// gloo never wait on each other for them. Not for several threads at once.
class RankHosts {
 public:
  explicit RankHosts(HostLayout layout);
  RankHosts(Store& store, std::string prefix, int rank, int ranks);

  int ranks() const { return ranks_; }
  // The first call of a group learning them waits for every rank (up to the store's timeout).
  const HostLayout& layout() const;

 private:
  Store* store_ = nullptr;
  std::string prefix_;
  int rank_ = 0;
  int ranks_ = 1;
  mutable std::optional<HostLayout> layout_;
};

// Where the ranks of a group run, as `auto` and the backends see it.
struct Placement {
  DeviceKind device = DeviceKind::cpu;  // where the collectives' buffers live
  const RankHosts& hosts;
};

}  // namespace partrain::comm
