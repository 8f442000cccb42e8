// The asio-ring backend: PeerTransport + PeerCollectives behind the Communicator contract: our
// own collectives over TCP, each call by the algorithm its size and the world call for (the
// ring for large messages, whence the name).
//
// The lock, the buffer checks and the naming of a failed rank are CheckedCommunicator's; a
// failure here names the peer the transport lost (PeerError), which may only be the peer of
// the rank that failed first.

#include "comm_backends/algorithms/peer_collectives.h"
#include "comm_backends/backends/backend.h"
#include "comm_backends/peer/peer_transport.h"

namespace partrain::comm {

namespace {

// The transport keeps its keys under the communicator's prefix + this.
std::string transport_prefix(const std::string& prefix) { return prefix + "peers/"; }

PeerTransportOptions transport_options(const BackendArgs& args) {
  PeerTransportOptions o;
  o.token = args.options.token;
  o.bind_host = args.options.bind_host;
  o.key_prefix = transport_prefix(args.prefix);
  o.timeout = args.options.timeout;
  o.tcp_congestion = args.options.tcp_congestion;
  o.name = "asio-ring";
  return o;
}

PeerCollectivesOptions collectives_options(const BackendArgs& args) {
  PeerCollectivesOptions o;
  if (args.options.ring_chunk_bytes > 0) o.chunk_bytes = args.options.ring_chunk_bytes;
  o.algorithm = parse_algorithm_request(args.options.algorithm);
  // A copy: what the group already knows, or how to learn it through the store that the
  // transport relies on too; the first call that needs it asks (every rank is there anyway):
  // an automatic allreduce at three ranks or more, or a call of more than one chunk by
  // recursive doubling, halving or Rabenseifner (PeerCollectivesOptions::hosts).
  o.hosts = args.placement.hosts;
  return o;
}

class AsioRingCommunicator : public Communicator {
 public:
  explicit AsioRingCommunicator(const BackendArgs& args)
      : transport_(args.store, args.rank, args.size(), transport_options(args)),
        collectives_(transport_, collectives_options(args)),
        wire_(args.options.wire_dtype) {}

  int rank() const override { return transport_.rank(); }
  int size() const override { return transport_.size(); }
  std::string name() const override { return "asio-ring"; }
  Capabilities capabilities() const override {
    return {.host_memory = true, .device_memory = false, .native_reduce_scatter = true};
  }
  std::string last_algorithm() const override {
    return std::string(algorithm_name(collectives_.last_algorithm()));
  }

  void allreduce(Buffer buffer, ReduceOp op) override {
    collectives_.allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_);
  }
  void reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) override {
    collectives_.reduce_scatter(in.data, out.data, out.count, in.dtype, op, wire_);
  }
  void broadcast(Buffer buffer, int root) override {
    collectives_.broadcast(buffer.data, buffer.bytes(), root);
  }
  void allgather(const Buffer& in, Buffer out) override {
    collectives_.allgather(in.data, out.data, in.bytes());
  }
  void barrier() override { collectives_.barrier(); }

 private:
  PeerTransport transport_;
  PeerCollectives collectives_;
  DType wire_;
};

}  // namespace

std::string asio_ring_address_key(const std::string& prefix, int rank) {
  return peer_address_key(transport_prefix(prefix), rank);
}

constinit const BackendEntry kAsioRingBackend{"asio-ring", true, "", usable_anywhere,
                                              make_backend<AsioRingCommunicator>};

}  // namespace partrain::comm
