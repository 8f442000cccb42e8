// defines: PeerCollectives — allreduce, reduce_scatter, allgather, broadcast and barrier over a
// PeerTransport, each call carried out by the algorithm algorithm_choice.h picks for its size
// and the world (or the one comm.algorithm forces).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "comm_backends/algorithms/algorithm_choice.h"
#include "comm_backends/algorithms/algorithms.h"
#include "comm_backends/buffer.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/placement.h"

namespace partrain::comm {

inline constexpr std::size_t kDefaultRingChunkBytes = 256 << 10;

struct PeerCollectivesOptions {
  // The ring's pipeline chunk, and the pieces the other algorithms' exchanges are cut into.
  std::size_t chunk_bytes = kDefaultRingChunkBytes;
  AlgorithmRequest algorithm = AlgorithmRequest::automatic;
  CostModel model = loopback_model();
  // Where the ranks run, learned (and waited for) at the first call that needs it: the first
  // whose choice depends on it (choice_depends_on_hosts(): the first automatic allreduce at
  // three ranks or more), or the first of more than one chunk by recursive doubling, halving or
  // Rabenseifner (pieces_for()); none: as if on one host.
  std::optional<RankHosts> hosts;
  // Exchanges go whole whatever `hosts` says: set where the ranks share cores and `hosts` does
  // not know it (the hierarchical backend's leaders).
  bool whole_exchanges = false;
};

class PeerCollectives {
 public:
  PeerCollectives(PeerTransport& transport, const PeerCollectivesOptions& options);

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }

  // wire: f32 (exact) or f16/bf16 for floating data; ignored for f64 and integers.
  void allreduce(void* data, std::size_t count, DType dtype, ReduceOp op, DType wire);
  // `in` holds size() blocks of `count` elements; rank r's `out` gets the reduction of block
  // r over the ranks. `in` is left as it was.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                      DType wire);
  void allgather(const void* in, void* out, std::size_t bytes_per_rank);
  void broadcast(void* data, std::size_t bytes, int root);
  void barrier();

  // The algorithm of the last call (none for a call that moved nothing).
  Algorithm last_algorithm() const { return last_; }
  // The algorithm a call of this kind and size (as predicted_seconds() counts it) takes; the
  // first call that needs the hosts learns them (options' hosts).
  Algorithm algorithm_for(CollectiveKind kind, std::size_t bytes);
  std::uint64_t calls() const { return sequence_; }

 private:
  CollectiveCall next_call(CollectiveKind kind, Algorithm algorithm);
  void reduce_all(CollectiveKind kind, void* data, std::size_t count, DType dtype, ReduceOp op,
                  DType wire);
  Reduction reduction(DType dtype, ReduceOp op, DType& wire) const;
  std::uint8_t* work_copy(const void* data, std::size_t count, DType dtype, DType work);
  // The hosts' layout and its traffic, learned once (a store exchange every rank makes at the
  // same call).
  void learn_hosts();
  // What a call of `bytes` by algorithm `a` moves its data in: the ring its chunks; recursive
  // doubling, halving and Rabenseifner pieces of their exchanges (Note [Pipelined exchange] in
  // recursive_doubling.cpp), of the chunk unless ranks share cores, where they go whole; such a
  // call of more than one chunk learns the hosts to know.
  std::size_t pieces_for(Algorithm a, std::size_t bytes);

  PeerTransport& transport_;
  PeerCollectivesOptions options_;
  std::uint64_t sequence_ = 0;
  Algorithm last_ = Algorithm::none;
  std::optional<HostTraffic> traffic_;  // once the hosts are learned
  Scratch scratch_;
  std::vector<std::uint8_t> work_;  // a work copy: f32 for f16/bf16, or a reduce_scatter's input
};

}  // namespace partrain::comm
