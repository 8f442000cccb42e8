// The host layout rank 0 publishes in the store, as every other rank reads it: either refused
// with a CommError, or a layout of exactly the world's ranks that reads back the same. No
// count in it is trusted before the bytes to hold it are there.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm_backends/placement.h"
#include "common/errors.h"
#include "fuzz/fuzz_targets.h"

namespace partrain::fuzz {

void fuzz_layout(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return;
  // The first byte picks the world the reading rank is in.
  const int ranks = 1 + data[0];
  const std::vector<std::uint8_t> bytes(data + 1, data + size);
  comm::HostLayout layout;
  try {
    layout = comm::decode_host_layout(bytes, ranks);
  } catch (const CommError& e) {
    throw UsageError(e.what());  // the decoder's refusal
  }
  if (layout.ranks() != ranks) throw InvariantBroken("layout: another number of ranks");
  int held = 0;
  for (const int n : layout.host_sizes) held += n;
  if (held != ranks || layout.host_of(0) != 0) {
    throw InvariantBroken("layout: hosts do not hold the ranks, host 0 first");
  }
  std::vector<std::string> distinct = layout.identities;
  std::sort(distinct.begin(), distinct.end());
  if (std::adjacent_find(distinct.begin(), distinct.end()) != distinct.end()) {
    throw InvariantBroken("layout: one host twice");
  }
  if (comm::decode_host_layout(comm::encode_host_layout(layout), ranks) != layout) {
    throw InvariantBroken("layout: does not read back the same");
  }
}

}  // namespace partrain::fuzz
