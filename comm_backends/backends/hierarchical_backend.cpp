// The hierarchical backend: for ranks on several hosts, several on some. Shared memory
// inside each host (ShmCollectives over a ShmRegion), the TCP ring among one leader per host
// (RingTransport + RingCollectives), composed as Note [Hierarchical collectives] says.
//
// Note [Hierarchical collectives]
// Ranks are grouped by host_identity(), as the group's placement holds them (learned through
// the store, not from what a launcher says about local ranks). Hosts are numbered in the
// order of their lowest rank, and the lowest rank of each host is its *leader*; the leaders
// form a ring of their own, host h at position h.
//
//   allreduce:  shm allreduce inside the host (f32 wire: exact)  ->  the leaders' ring
//               allreduce of the host partials (comm.wire_dtype on the wire)  ->  shm
//               broadcast from the leader
//   broadcast:  shm broadcast from the root inside its host -> ring broadcast from the root's
//               leader -> shm broadcast from the leader on the other hosts
//   allgather:  shm allgather inside the host -> ring allgather of the hosts' blocks (padded
//               to the largest host) -> the leader puts them in rank order -> shm broadcast
//   barrier:    shm barrier -> ring barrier -> shm barrier
//
// Reduction order, element by element: each host first combines its ranks' values in the
// order the flat ring would among them (shm_collectives.cpp), then the leaders combine the
// host partials in ring order among hosts (the segment of element e starts at host k and
// travels k, k+1, ...; ring_allreduce.cpp). f16/bf16 data are widened to f32 once and
// rounded back once, at the end. avg runs as sum, and the leader divides by the world size
// before the last broadcast. So the result differs from the flat ring's only by float
// rounding, and every rank ends with the same bits: the leaders' ring leaves the same bits
// on every leader (its reduced-precision wire included), and the last step copies them.
// With one host this is the shm backend, with one rank per host the flat ring, bit for bit.
//
// Faults. Every wait is bounded: the shm parts by comm.timeout_s, the ring by comm.timeout_s
// per collective, and a rank that waits on its leader while the leader is in the ring by
// comm.timeout_s plus a grace period. A rank that fails (PeerError) tells the others at once
// what it knows: a leader closes its ring connections (so the next leaders stop waiting) and
// every rank marks itself failed in its host's region, naming whom it blames (so its host's
// ranks stop waiting too). Then it follows the chain of blame through the store
// (failure_trace.h) to the rank that reported nothing, and names that one: a local rank that
// died behind a leader on another host is named on every host, not the leader in front of it.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

#include "comm_backends/backends/backend.h"
#include "comm_backends/backends/failure_trace.h"
#include "comm_backends/reduction.h"
#include "comm_backends/ring/ring_allreduce.h"
#include "comm_backends/ring/ring_transport.h"
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
  if (layout.hosts.size() < 2) return "every rank on one host (shm serves that)";
  if (layout.largest_host() < 2) return "one rank per host (asio-ring serves that)";
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
    host_ = layout_.host_of[rank_];
    const std::vector<int>& mine = layout_.hosts[host_];
    local_rank_ = static_cast<int>(std::find(mine.begin(), mine.end(), rank_) - mine.begin());
    for (const auto& ranks : layout_.hosts) {
      leaders_.push_back(ranks.front());
      max_local_ = std::max(max_local_, ranks.size());
    }
    const int local_size = static_cast<int>(mine.size());
    if (local_size > 1) {
      region_ = std::make_unique<ShmRegion>(
          store_, prefix_ + "hosts/" + std::to_string(host_) + "/", options.token, local_rank_,
          local_size, shm_region_bytes(local_size), options.timeout, [&](void* address) {
            local_ = std::make_unique<ShmCollectives>(address, local_rank_, local_size,
                                                      options.timeout, mine);
          });
    }
    if (local_rank_ == 0 && layout_.hosts.size() > 1) {
      across_hosts([&] {
        transport_ = std::make_unique<RingTransport>(
            store_, host_, static_cast<int>(layout_.hosts.size()),
            RingTransportOptions{options.token, options.bind_host, prefix_ + "leaders/",
                                 options.timeout});
      });
      ring_ = std::make_unique<RingCollectives>(
          *transport_, options.timeout,
          options.ring_chunk_bytes > 0 ? options.ring_chunk_bytes : kDefaultRingChunkBytes);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "hierarchical"; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    check_host_buffer(buffer, name());
    std::lock_guard<std::mutex> lock(mutex_);
    if (size_ == 1) return;
    guarded([&] {
      if (layout_.hosts.size() == 1) {
        return local_->allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_);
      }
      if (max_local_ == 1) {
        return across_hosts(
            [&] { ring_->allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_); });
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
      if (ring_) {
        across_hosts([&] { ring_->allreduce(work, buffer.count, acc, partial, wire_); });
        if (op == ReduceOp::avg) divide_elements(work, acc, buffer.count, size_);
      }
      if (local_) from_leader(work, buffer.count * dtype_size(acc));
      if (acc != buffer.dtype) {
        convert_elements(work_.data(), acc, buffer.data, buffer.dtype, buffer.count);
      }
    });
  }

  void broadcast(Buffer buffer, int root) override {
    check_host_buffer(buffer, name());
    PARTRAIN_CHECK(root >= 0 && root < size_, UsageError, "broadcast: root ", root,
                   " is outside a world of ", size_);
    std::lock_guard<std::mutex> lock(mutex_);
    if (size_ == 1) return;
    guarded([&] {
      const int root_host = layout_.host_of[root];
      if (host_ == root_host && local_) {
        const auto& mine = layout_.hosts[host_];
        const int local_root =
            static_cast<int>(std::find(mine.begin(), mine.end(), root) - mine.begin());
        local_->broadcast(buffer.data, buffer.bytes(), local_root);
      }
      if (ring_) across_hosts([&] { ring_->broadcast(buffer.data, buffer.bytes(), root_host); });
      if (host_ != root_host && local_) from_leader(buffer.data, buffer.bytes());
    });
  }

  void allgather(const Buffer& in, Buffer out) override {
    check_host_buffer(in, name());
    check_host_buffer(out, name());
    check_allgather_buffers(in, out, size_);
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t per_rank = in.bytes();
    if (size_ == 1) {
      if (per_rank > 0 && out.data != in.data) std::memmove(out.data, in.data, per_rank);
      return;
    }
    guarded([&] {
      if (layout_.hosts.size() == 1) return local_->allgather(in.data, out.data, per_rank);
      // Each host's block: its ranks' inputs in local order, padded to the largest host, so
      // that the ring moves equal blocks.
      const std::size_t host_bytes = max_local_ * per_rank;
      const auto& mine = layout_.hosts[host_];
      std::uint8_t* block = nullptr;
      if (ring_) {
        gather_.resize(layout_.hosts.size() * host_bytes);
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
      if (ring_) {
        across_hosts([&] { ring_->allgather(block, gather_.data(), host_bytes); });
        auto* target = static_cast<std::uint8_t*>(out.data);
        for (std::size_t h = 0; h < layout_.hosts.size(); ++h) {
          for (std::size_t j = 0; j < layout_.hosts[h].size() && per_rank > 0; ++j) {
            std::memcpy(target + layout_.hosts[h][j] * per_rank,
                        gather_.data() + h * host_bytes + j * per_rank, per_rank);
          }
        }
      }
      if (local_) from_leader(out.data, size_ * per_rank);
    });
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (size_ == 1) return;
    guarded([&] {
      if (layout_.hosts.size() == 1) return local_->barrier();
      if (local_) local_->barrier();
      if (ring_) across_hosts([&] { ring_->barrier(); });
      if (local_) local_->barrier(local_rank_ == 0 ? std::chrono::milliseconds(0) : leader_wait());
    });
  }

 private:
  // What a rank may wait, beyond the timeout, on its leader busy in the ring: the ring's own
  // bound is the timeout, and a leader that fails there tells its host at once.
  std::chrono::milliseconds leader_wait() const { return timeout_ + grace_; }

  void from_leader(void* data, std::size_t bytes) {
    local_->broadcast(data, bytes, 0,
                      local_rank_ == 0 ? std::chrono::milliseconds(0) : leader_wait());
  }

  // Ring errors name positions in the leaders' ring; the rest of the run knows ranks.
  template <typename F>
  void across_hosts(F&& step) {
    try {
      step();
    } catch (const PeerError& e) {
      const int host = e.peer_rank();
      if (host < 0 || host >= static_cast<int>(leaders_.size())) throw;
      throw PeerError(leaders_[host], "hierarchical: rank " + std::to_string(leaders_[host]) +
                                          " (the leader of host " + std::to_string(host) +
                                          ", ring position " + std::to_string(host) +
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
      // Whoever waits on this rank stops now: the next leaders (their ring breaks) and this
      // host's ranks (the mark names whom this rank blames). Then the chain of blame.
      if (transport_) transport_->break_ring();
      if (local_) local_->mark_failed(e.peer_rank());
      rethrow_traced(e, "hierarchical", store_, prefix_ + "trace/", rank_, size_, grace_, timeout_);
    } catch (const CommError&) {
      broken_ = true;
      if (transport_) transport_->break_ring();
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
  int host_ = 0;
  int local_rank_ = 0;
  std::vector<int> leaders_;                  // host -> its leader's rank
  std::size_t max_local_ = 1;                 // ranks on the fullest host
  std::unique_ptr<ShmRegion> region_;         // with more than one rank on this host
  std::unique_ptr<ShmCollectives> local_;     // over region_
  std::unique_ptr<RingTransport> transport_;  // on a leader, with more than one host
  std::unique_ptr<RingCollectives> ring_;     // over transport_
  std::vector<std::uint8_t> work_;            // f32 copy of f16/bf16 data
  std::vector<std::uint8_t> gather_;          // allgather: the hosts' blocks
  bool broken_ = false;
  std::mutex mutex_;  // one collective at a time: the byte streams carry them in order
};

}  // namespace

constinit const BackendEntry kHierarchicalBackend{"hierarchical", true, "", usable,
                                                  make_backend<HierarchicalCommunicator>};

}  // namespace partrain::comm
