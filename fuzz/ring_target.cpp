// The peer port: what a stranger can send before a connection is accepted (handshake and
// token), what a peer's frame header can say, and the address text ranks publish in the store.
#include <cstdint>
#include <cstring>
#include <string>

#include "comm_backends/net/timed_io.h"
#include "comm_backends/peer/peer_transport.h"
#include "fuzz/fuzz_targets.h"

namespace partrain::fuzz {

void fuzz_ring(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return;
  // The first byte picks the world and the accepting rank (only lower ranks connect to it).
  const int world = 2 + data[0] % 8;
  const int acceptor = (data[0] >> 3) % world;
  const std::string token = "run-token";
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const std::size_t count = size - 1;

  // Only the exact handshake of a lower rank, this world and token length passes the check,
  // and it names that rank.
  if (count >= comm::kPeerHandshakeBytes) {
    const int passed = comm::check_peer_handshake(bytes, acceptor, world, token.size());
    int right = -1;
    for (int r = 0; r < acceptor; ++r) {
      const std::string hello = comm::encode_peer_handshake(r, world, token);
      if (std::memcmp(bytes, hello.data(), comm::kPeerHandshakeBytes) == 0) right = r;
    }
    if (passed != right) {
      throw InvariantBroken(passed >= 0 ? "peer: a wrong handshake passes the check"
                                        : "peer: the right handshake is refused");
    }
  }

  // Whatever header arrives, the disagreement message is made without reading past it.
  if (count >= comm::kFrameHeaderBytes) {
    const std::string said = comm::describe_frame(data + 1);
    const bool framed = std::memcmp(bytes, "PTCF", 4) == 0;
    if (said.empty() || framed != (said != "something unrecognisable")) {
      throw InvariantBroken("peer: frame header described as '" + said + "'");
    }
  }

  // A published address: either refused or a host and a port in range.
  std::string host;
  int port = -1;
  if (comm::net::split_host_port(std::string(bytes, count), host, port) &&
      (host.empty() || port < 0 || port > 65535)) {
    throw InvariantBroken("peer: address parsed to host '" + host + "' port " +
                          std::to_string(port));
  }
}

}  // namespace partrain::fuzz
