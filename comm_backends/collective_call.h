// defines: CollectiveKind, Algorithm and CollectiveCall — what a collective call is (kind,
// sequence number, size, dtypes, op, root, the algorithm that carries it out), as the peer
// transport's frame header and the shared-memory control block carry it, so that ranks that
// disagree fail with both calls named in words.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "comm_backends/buffer.h"

namespace partrain::comm {

enum class CollectiveKind : std::uint8_t {
  allreduce = 1,
  broadcast = 2,
  allgather = 3,
  barrier = 4,
  reduce_scatter = 5
};
std::string_view collective_kind_name(CollectiveKind kind);  // "allreduce", "reduce_scatter", ...

// How a collective moves its data (comm_backends/algorithms/). `none`: the backend has no
// such choice (shm, gloo, nccl name their own in algorithm_name()).
enum class Algorithm : std::uint8_t {
  none = 0,
  ring = 1,                // allreduce, reduce_scatter, allgather; broadcast as a chain
  recursive_doubling = 2,  // allreduce, allgather
  rabenseifner = 3,        // allreduce: reduce-scatter by halving + allgather by doubling
  recursive_halving = 4,   // reduce_scatter
  binomial_tree = 5,       // broadcast
};
std::string_view algorithm_name(Algorithm algorithm);  // "ring", "recursive_doubling", ...

// Plain bytes (no padding), so that calls compare with memcmp.
struct CollectiveCall {
  std::uint64_t sequence = 0;
  // The size of the call: elements for allreduce, reduce_scatter (per rank) and barrier,
  // bytes (per rank for allgather) for broadcast and allgather; the other one stays zero.
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
  std::int32_t root = 0;
  std::uint8_t kind = 0, dtype = 0, wire = 0, op = 0;
  std::uint8_t algorithm = 0;
  std::uint8_t reserved[7] = {};

  bool counts_elements() const {
    return kind == static_cast<std::uint8_t>(CollectiveKind::allreduce) ||
           kind == static_cast<std::uint8_t>(CollectiveKind::reduce_scatter) ||
           kind == static_cast<std::uint8_t>(CollectiveKind::barrier);
  }
  // "allreduce #12 of 1000 f32 (sum, wire bf16) by ring", "broadcast #3 of 40 bytes from
  // root 1".
  std::string describe() const;
};
static_assert(sizeof(CollectiveCall) == 40, "no padding: calls are compared byte for byte");

}  // namespace partrain::comm
