// The hierarchical backend: for ranks on several hosts, several on some. Shared memory
// inside each host (ShmCollectives over a ShmRegion), the peer transport's collectives among
// one leader per host (PeerTransport + PeerCollectives, as asio-ring), composed as
// Note [Hierarchical collectives] says.
//
// Note [Hierarchical collectives]
// Ranks are grouped by host_identity(), as the group's placement holds them (learned through
// the store, not from what a launcher says about local ranks). Hosts are numbered in the
// order of their lowest rank, and the lowest rank of each host is its *leader*; the leaders
// form a group of their own, host h its rank h, whose collectives take their algorithm by
// size and the number of hosts as asio-ring's do (algorithm_choice.h).
//
//   allreduce:  shm allreduce inside the host (f32 wire: exact)  ->  the leaders' allreduce
//               of the host partials (comm.wire_dtype on the wire)  ->  shm broadcast from
//               the leader
//   reduce_scatter: shm allreduce of the whole input inside the host -> the leaders'
//               reduce_scatter of the host partials, the blocks of each host's ranks
//               together -> shm broadcast of the host's blocks; each rank keeps its own
//   broadcast:  shm broadcast from the root inside its host -> the leaders' broadcast from
//               the root's leader -> shm broadcast from the leader on the other hosts
//   allgather:  shm allgather inside the host -> the leaders' allgather of the hosts' blocks
//               (padded to the largest host) -> the leader puts them in rank order -> shm
//               broadcast
//   barrier:    shm barrier -> the leaders' barrier -> shm barrier
//
// Reduction order, element by element: each host first combines its ranks' values in the
// order the flat ring would among them (shm_collectives.cpp), then the leaders combine the
// host partials as their algorithm does (algorithms.h). f16/bf16 data are widened to f32 once
// and rounded back once, at the end. avg runs as sum, and the leader divides by the world size
// before the last broadcast. So the result differs from asio-ring's only by float rounding,
// and every rank ends with the same bits: the leaders' algorithms leave the same bits on every
// leader (a reduced-precision wire included), and the last step copies them. With one host
// this is the shm backend, with one rank per host asio-ring with the same comm.algorithm, bit
// for bit.
//
// Faults. Every wait is bounded: the shm parts by comm.timeout_s, the leaders' collectives by
// comm.timeout_s each, and a rank that waits on its leader while the leader is among the
// leaders by comm.timeout_s plus a grace period. A rank that fails (PeerError) tells the others
// at once what it knows: a leader closes its connections (so the other leaders stop waiting) and
// every rank marks itself failed in its host's region, naming whom it blames (so its host's
// ranks stop waiting too). Then it follows the chain of blame through the store
// (failure_trace.h) to the rank that reported nothing, and names that one: a local rank that
// died behind a leader on another host is named on every host, not the leader in front of it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "comm_backends/backends/backend.h"
#include "comm_backends/backends/failure_trace.h"
#include "comm_backends/reduction.h"
#include "comm_backends/algorithms/peer_collectives.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/shm/shm_collectives.h"
#include "comm_backends/shm/shm_region.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {
namespace {

// Nothing when the ranks span hosts with several on some; else why `auto` leaves it alone
// (named, it serves any placement: one host is shm, one rank per host the flat ring).
std::optional<std::string> usable(const Placement& placement) {
  const HostLayout& layout = placement.hosts.layout();
  if (layout.host_count() < 2) return "every rank on one host (shm serves that)";
  if (layout.largest_host() < 2) return "one rank per host (asio-ring serves that)";
  for (std::size_t h = 0; h < layout.host_count(); ++h) {
    if (layout.host_sizes[h] < 2) continue;
    if (auto misfit = shm_region_misfit(layout.host_sizes[h], layout.shm_room_of(h))) {
      return "on host '" + layout.identities[h] + "', " + *misfit;
    }
  }
  return std::nullopt;
}

class HierarchicalCommunicator : public Communicator {
 public:
  explicit HierarchicalCommunicator(const BackendArgs& args)
      : rank_(args.rank),
        size_(args.size()),
        store_(args.store),
        prefix_(args.prefix),
        wire_(args.options.wire_dtype),
        timeout_(args.options.timeout),
        grace_(failure_grace(args.options.timeout)),
        layout_(args.placement.hosts.layout()) {
    const CommOptions& options = args.options;
    for (std::size_t h = 0; h < layout_.host_count(); ++h) {
      hosts_.push_back(layout_.members(static_cast<int>(h)));
    }
    host_ = layout_.host_of(rank_);
    const std::vector<int>& mine = hosts_[host_];
    local_rank_ = static_cast<int>(std::find(mine.begin(), mine.end(), rank_) - mine.begin());
    for (const auto& ranks : hosts_) {
      leaders_.push_back(ranks.front());
      max_local_ = std::max(max_local_, ranks.size());
    }
    const int local_size = static_cast<int>(mine.size());
    if (local_size > 1) {
      region_ = std::make_unique<ShmRegion>(
          store_, prefix_ + "hosts/" + std::to_string(host_) + "/", options.token, local_rank_,
          local_size, shm_region_bytes(local_size), options.timeout, [&](void* address) {
            ShmOptions shm;
            shm.timeout = options.timeout;
            shm.rank_names = mine;
            shm.shared_cores = layout_.shares_cores(host_);
            shm.single_copy = options.shm_single_copy;
            local_ = std::make_unique<ShmCollectives>(address, local_rank_, local_size, shm);
          });
    }
    if (local_rank_ == 0 && hosts_.size() > 1) {
      PeerTransportOptions peers;
      peers.token = options.token;
      peers.bind_host = options.bind_host;
      peers.key_prefix = prefix_ + "leaders/";
      peers.timeout = options.timeout;
      peers.tcp_congestion = options.tcp_congestion;
      peers.name = "hierarchical";
      across_hosts([&] {
        transport_ =
            std::make_unique<PeerTransport>(store_, host_, static_cast<int>(hosts_.size()), peers);
      });
      PeerCollectivesOptions collectives;
      if (options.ring_chunk_bytes > 0) collectives.chunk_bytes = options.ring_chunk_bytes;
      collectives.algorithm = parse_algorithm_request(options.algorithm);
      // The leaders, one a host: the choice that asio-ring makes for one rank per host.
      std::vector<std::string> one_each;
      for (std::size_t h = 0; h < hosts_.size(); ++h) one_each.push_back(std::to_string(h));
      collectives.hosts = RankHosts(group_by_host(one_each));
      // That layout knows no cores: where this group's ranks share them, exchanges go whole
      // (Note [Pipelined exchange]).
      collectives.whole_exchanges = layout_.shares_cores();
      between_hosts_ = std::make_unique<PeerCollectives>(*transport_, collectives);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "hierarchical"; }
  Capabilities capabilities() const override {
    return {.host_memory = true, .device_memory = false, .native_reduce_scatter = true};
  }
  // What this rank saw: shared memory, and on a leader the leaders' algorithm.
  std::string last_algorithm() const override {
    if (!between_hosts_) return "shared_memory";
    const std::string leaders(algorithm_name(between_hosts_->last_algorithm()));
    return local_ ? "shared_memory+" + leaders : leaders;
  }

  void allreduce(Buffer buffer, ReduceOp op) override {
    if (size_ == 1) return;
    guarded([&] {
      if (hosts_.size() == 1) {
        return local_->allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_);
      }
      if (max_local_ == 1) {
        return across_hosts(
            [&] { between_hosts_->allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_); });
      }
      const DType acc = accumulator_type(buffer.dtype);
      void* work = buffer.data;
      if (acc != buffer.dtype) {
        work_.resize(buffer.count * dtype_size(acc));
        convert_elements(buffer.data, buffer.dtype, work_.data(), acc, buffer.count);
        work = work_.data();
      }
      const ReduceOp partial = op == ReduceOp::avg ? ReduceOp::sum : op;
      if (local_) local_->allreduce(work, buffer.count, acc, partial, acc);
      if (between_hosts_) {
        across_hosts([&] { between_hosts_->allreduce(work, buffer.count, acc, partial, wire_); });
        if (op == ReduceOp::avg) divide_elements(work, acc, buffer.count, size_);
      }
      if (local_) from_leader(work, buffer.count * dtype_size(acc));
      if (acc != buffer.dtype) {
        convert_elements(work_.data(), acc, buffer.data, buffer.dtype, buffer.count);
      }
    });
  }

  // The input's blocks of this host's ranks are reduced by the leaders alone, each host's
  // blocks side by side (padded to the fullest host); the leader hands its host the result.
  void reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) override {
    const std::size_t n = out.count;
    if (size_ == 1) {
      if (n > 0) std::memmove(out.data, in.data, out.bytes());
      return;
    }
    guarded([&] {
      if (hosts_.size() == 1) {
        return local_->reduce_scatter(in.data, out.data, n, in.dtype, op, wire_);
      }
      if (max_local_ == 1) {
        return across_hosts(
            [&] { between_hosts_->reduce_scatter(in.data, out.data, n, in.dtype, op, wire_); });
      }
      const DType acc = accumulator_type(in.dtype);
      const std::size_t elem = dtype_size(acc), total = in.count;
      work_.resize(total * elem);
      convert_elements(in.data, in.dtype, work_.data(), acc, total);
      const ReduceOp partial = op == ReduceOp::avg ? ReduceOp::sum : op;
      if (local_) local_->allreduce(work_.data(), total, acc, partial, acc);
      const auto& mine = hosts_[host_];
      const std::size_t host_elems = max_local_ * n;
      if (between_hosts_) {
        gather_.assign(hosts_.size() * host_elems * elem, 0);
        for (std::size_t h = 0; h < hosts_.size(); ++h) {
          for (std::size_t j = 0; j < hosts_[h].size() && n > 0; ++j) {
            std::memcpy(gather_.data() + (h * host_elems + j * n) * elem,
                        work_.data() + hosts_[h][j] * n * elem, n * elem);
          }
        }
        across_hosts([&] {
          between_hosts_->reduce_scatter(gather_.data(), work_.data(), host_elems, acc, partial,
                                         wire_);
        });
        if (op == ReduceOp::avg) divide_elements(work_.data(), acc, mine.size() * n, size_);
      }
      if (local_) from_leader(work_.data(), mine.size() * n * elem);
      convert_elements(work_.data() + local_rank_ * n * elem, acc, out.data, out.dtype, n);
    });
  }

  void broadcast(Buffer buffer, int root) override {
    if (size_ == 1) return;
    guarded([&] {
      const int root_host = layout_.host_of(root);
      if (host_ == root_host && local_) {
        const auto& mine = hosts_[host_];
        const int local_root =
            static_cast<int>(std::find(mine.begin(), mine.end(), root) - mine.begin());
        local_->broadcast(buffer.data, buffer.bytes(), local_root);
      }
      if (between_hosts_)
        across_hosts([&] { between_hosts_->broadcast(buffer.data, buffer.bytes(), root_host); });
      if (host_ != root_host && local_) from_leader(buffer.data, buffer.bytes());
    });
  }

  void allgather(const Buffer& in, Buffer out) override {
    const std::size_t per_rank = in.bytes();
    if (size_ == 1) {
      if (per_rank > 0 && out.data != in.data) std::memmove(out.data, in.data, per_rank);
      return;
    }
    guarded([&] {
      if (hosts_.size() == 1) return local_->allgather(in.data, out.data, per_rank);
      // Each host's block: its ranks' inputs in local order, padded to the largest host, so
      // that the leaders move equal blocks.
      const std::size_t host_bytes = max_local_ * per_rank;
      const auto& mine = hosts_[host_];
      std::uint8_t* block = nullptr;
      if (between_hosts_) {
        gather_.resize(hosts_.size() * host_bytes);
        block = gather_.data() + host_ * host_bytes;
      } else {
        gather_.resize(mine.size() * per_rank);
        block = gather_.data();
      }
      if (local_) {
        local_->allgather(in.data, block, per_rank);
      } else if (per_rank > 0) {
        std::memcpy(block, in.data, per_rank);
      }
      if (between_hosts_) {
        across_hosts([&] { between_hosts_->allgather(block, gather_.data(), host_bytes); });
        auto* target = static_cast<std::uint8_t*>(out.data);
        for (std::size_t h = 0; h < hosts_.size(); ++h) {
          for (std::size_t j = 0; j < hosts_[h].size() && per_rank > 0; ++j) {
            std::memcpy(target + hosts_[h][j] * per_rank,
                        gather_.data() + h * host_bytes + j * per_rank, per_rank);
          }
        }
      }
      if (local_) from_leader(out.data, size_ * per_rank);
    });
  }

  void barrier() override {
    if (size_ == 1) return;
    guarded([&] {
      if (hosts_.size() == 1) return local_->barrier();
      if (local_) local_->barrier();
      if (between_hosts_) across_hosts([&] { between_hosts_->barrier(); });
      if (local_) local_->barrier(local_rank_ == 0 ? std::chrono::milliseconds(0) : leader_wait());
    });
  }

 private:
  // What a rank may wait, beyond the timeout, on its leader busy among the leaders: their own
  // bound is the timeout, and a leader that fails there tells its host at once.
  std::chrono::milliseconds leader_wait() const { return timeout_ + grace_; }

  void from_leader(void* data, std::size_t bytes) {
    local_->broadcast(data, bytes, 0,
                      local_rank_ == 0 ? std::chrono::milliseconds(0) : leader_wait());
  }

  // The leaders' errors name their ranks among the leaders; the rest of the run knows ranks.
  template <typename F>
  void across_hosts(F&& step) {
    try {
      step();
    } catch (const PeerError& e) {
      const int host = e.peer_rank();
      if (host < 0 || host >= static_cast<int>(leaders_.size())) throw;
      throw PeerError(leaders_[host], "hierarchical: rank " + std::to_string(leaders_[host]) +
                                          " (the leader of host " + std::to_string(host) +
                                          ", rank " + std::to_string(host) +
                                          " among the host leaders): " + e.what());
    }
  }

  template <typename F>
  void guarded(F&& collective) {
    PARTRAIN_CHECK(!broken_, CommError,
                   "hierarchical: broken by an earlier failure; create a new communicator");
    try {
      collective();
    } catch (const PeerError& e) {
      broken_ = true;
      // Whoever waits on this rank stops now: the other leaders (its connections close) and this
      // host's ranks (the mark names whom this rank blames). The chain of blame through the
      // store, which names the rank lost first on every host, is CheckedCommunicator's.
      if (transport_) transport_->break_links();
      if (local_) local_->mark_failed(e.peer_rank());
      throw;
    } catch (const CommError&) {
      broken_ = true;
      if (transport_) transport_->break_links();
      if (local_) local_->mark_failed(rank_);
      throw;
    }
  }

  int rank_;
  int size_;
  Store& store_;
  std::string prefix_;
  DType wire_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds grace_;
  HostLayout layout_;
  std::vector<std::vector<int>> hosts_;  // host -> its ranks, ascending
  int host_ = 0;
  int local_rank_ = 0;
  std::vector<int> leaders_;                        // host -> its leader's rank
  std::size_t max_local_ = 1;                       // ranks on the fullest host
  std::unique_ptr<ShmRegion> region_;               // with more than one rank on this host
  std::unique_ptr<ShmCollectives> local_;           // over region_
  std::unique_ptr<PeerTransport> transport_;        // on a leader, with more than one host
  std::unique_ptr<PeerCollectives> between_hosts_;  // over transport_
  std::vector<std::uint8_t> work_;                  // f32 copy of f16/bf16 data
  std::vector<std::uint8_t> gather_;                // allgather: the hosts' blocks
  bool broken_ = false;
  std::mutex mutex_;  // one collective at a time: the byte streams carry them in order
};

}  // namespace

constinit const BackendEntry kHierarchicalBackend{"hierarchical", true, "", usable,
                                                  make_backend<HierarchicalCommunicator>};

}  // namespace partrain::comm
