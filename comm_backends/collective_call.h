// defines: CollectiveKind and CollectiveCall — what a collective call is (kind, sequence
// number, size, dtypes, op, root), as the ring's frame header and the shared-memory control
// block carry it, so that ranks that disagree fail with both calls named in words.
#pragma once

#include <cstdint>
#include <string>

#include "comm_backends/buffer.h"

namespace partrain::comm {

enum class CollectiveKind : std::uint8_t {
  allreduce = 1,
  broadcast = 2,
  allgather = 3,
  barrier = 4
};

// Plain bytes (no padding), so that calls compare with memcmp.
struct CollectiveCall {
  std::uint64_t sequence = 0;
  // The size of the call: elements for allreduce and barrier, bytes (per rank for allgather)
  // for broadcast and allgather; the other one stays zero.
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
  std::int32_t root = 0;
  std::uint8_t kind = 0, dtype = 0, wire = 0, op = 0;

  bool counts_elements() const {
    return kind == static_cast<std::uint8_t>(CollectiveKind::allreduce) ||
           kind == static_cast<std::uint8_t>(CollectiveKind::barrier);
  }
  // "allreduce #12 of 1000 f32 (sum, wire bf16)", "broadcast #3 of 40 bytes from root 1".
  std::string describe() const;
};
static_assert(sizeof(CollectiveCall) == 32, "no padding: calls are compared byte for byte");

}  // namespace partrain::comm
