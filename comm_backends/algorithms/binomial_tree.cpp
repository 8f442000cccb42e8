// A binomial tree broadcast: in ceil(log2 W) rounds the ranks that have the data send it to as
// many that do not, so the last rank has it after log2(W) messages instead of the chain's W-1.
// Positions count from the root (p = rank - root mod W): position p receives from p - m, where
// m is the lowest set bit of p, and sends to p + m' for each power of two m' below m (all of
// them for the root), the largest first, all at once.
#include "comm_backends/algorithms/algorithms.h"

#include <cstdint>

namespace partrain::comm {

void binomial_tree_broadcast(PeerTransport& t, std::uint8_t* data, std::size_t bytes, int root) {
  const int world = t.size();
  const int position = (t.rank() - root + world) % world;
  int mask = 1;
  while (mask < world) {
    if ((position & mask) != 0) {
      PeerTransport::Transfer from_parent;
      from_parent.peer = (t.rank() - mask + world) % world;
      from_parent.data = data;
      from_parent.bytes = bytes;
      t.start(from_parent);
      t.wait(from_parent);
      break;
    }
    mask <<= 1;
  }
  std::vector<PeerTransport::Transfer> to_children;
  to_children.reserve(32);  // started transfers must not move: at most log2(W) of them
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (position + mask >= world) continue;
    PeerTransport::Transfer& child = to_children.emplace_back();
    child.peer = (t.rank() + mask) % world;
    child.outgoing = true;
    child.data = data;
    child.bytes = bytes;
    t.start(child);
  }
  for (const auto& child : to_children) t.wait(child);
}

}  // namespace partrain::comm
