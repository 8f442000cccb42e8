// The ring port: what a stranger can send before the ring forms (handshake and token), what a
// neighbour's frame header can say, and the address text ranks publish in the store.
#include <cstring>
#include <string>

#include "comm_backends/net/timed_io.h"
#include "comm_backends/ring/ring_allreduce.h"
#include "comm_backends/ring/ring_transport.h"
#include "fuzz/fuzz_targets.h"

namespace partrain::fuzz {

void fuzz_ring(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return;
  // The first byte picks the world and which rank the accepting side expects.
  const int world = 2 + data[0] % 8;
  const int expected_rank = (data[0] >> 3) % world;
  const std::string token = "run-token";
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const std::size_t count = size - 1;

  // Only the exact handshake of the expected rank, world and token length passes the check.
  if (count >= comm::kRingHandshakeBytes) {
    const std::string right = comm::encode_ring_handshake(expected_rank, world, token);
    const bool passes = comm::check_ring_handshake(bytes, expected_rank, world, token.size());
    const bool is_right = std::memcmp(bytes, right.data(), comm::kRingHandshakeBytes) == 0;
    if (passes != is_right) {
      throw InvariantBroken(passes ? "ring: a wrong handshake passes the check"
                                   : "ring: the right handshake is refused");
    }
  }

  // Whatever header arrives, the disagreement message is made without reading past it.
  if (count >= comm::kRingFrameHeaderBytes) {
    const std::string said = comm::RingCollectives::describe_frame(data + 1);
    const bool framed = std::memcmp(bytes, "PTCF", 4) == 0;
    if (said.empty() || framed != (said != "something unrecognisable")) {
      throw InvariantBroken("ring: frame header described as '" + said + "'");
    }
  }

  // A published address: either refused or a host and a port in range.
  std::string host;
  int port = -1;
  if (comm::net::split_host_port(std::string(bytes, count), host, port) &&
      (host.empty() || port < 0 || port > 65535)) {
    throw InvariantBroken("ring: address parsed to host '" + host + "' port " +
                          std::to_string(port));
  }
}

}  // namespace partrain::fuzz
