// The asio-ring backend: RingTransport + RingCollectives behind the Communicator contract.
//
// Naming the failed rank: in a ring only the neighbours of a dead or silent rank see it go;
// the others see *their* neighbour close its sockets or stop sending. So a rank that fails
// with PeerError(p) blames p in the store and follows the chain of blame upstream to the
// rank that reported nothing (failure_trace.h).
#include <algorithm>
#include <mutex>

#include "comm_backends/backends/backend.h"
#include "comm_backends/backends/failure_trace.h"
#include "common/errors.h"
#include "comm_backends/ring/ring_allreduce.h"
#include "comm_backends/ring/ring_transport.h"
#include "comm_backends/store/store.h"

namespace partrain::comm {

namespace {

// The ring's transport keeps its keys under the communicator's prefix + this.
std::string transport_prefix(const std::string& prefix) { return prefix + "ring/"; }

class AsioRingCommunicator : public Communicator {
 public:
  explicit AsioRingCommunicator(const BackendArgs& args)
      : transport_(args.store, args.rank, args.size(),
                   RingTransportOptions{args.options.token, args.options.bind_host,
                                        transport_prefix(args.prefix), args.options.timeout}),
        ring_(transport_, args.options.timeout,
              args.options.ring_chunk_bytes > 0 ? args.options.ring_chunk_bytes
                                                : kDefaultRingChunkBytes),
        wire_(args.options.wire_dtype),
        store_(args.store),
        prefix_(args.prefix),
        grace_(failure_grace(args.options.timeout)),
        timeout_(args.options.timeout) {}

  int rank() const override { return transport_.rank(); }
  int size() const override { return transport_.size(); }
  std::string name() const override { return "asio-ring"; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    check_host_buffer(buffer, name());
    std::lock_guard<std::mutex> lock(mutex_);
    traced([&] { ring_.allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_); });
  }

  void broadcast(Buffer buffer, int root) override {
    check_host_buffer(buffer, name());
    std::lock_guard<std::mutex> lock(mutex_);
    traced([&] { ring_.broadcast(buffer.data, buffer.bytes(), root); });
  }

  void allgather(const Buffer& in, Buffer out) override {
    check_host_buffer(in, name());
    check_host_buffer(out, name());
    check_allgather_buffers(in, out, size());
    std::lock_guard<std::mutex> lock(mutex_);
    traced([&] { ring_.allgather(in.data, out.data, in.bytes()); });
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mutex_);
    traced([&] { ring_.barrier(); });
  }

 private:
  template <typename F>
  void traced(F&& collective) {
    try {
      collective();
    } catch (const PeerError& e) {
      rethrow_traced(e, "asio-ring", store_, prefix_, rank(), size(), grace_, timeout_);
    }
  }

  std::mutex mutex_;  // one collective at a time: the byte streams carry them in order
  RingTransport transport_;
  RingCollectives ring_;
  DType wire_;
  Store& store_;
  std::string prefix_;
  std::chrono::milliseconds grace_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::string asio_ring_address_key(const std::string& prefix, int rank) {
  return ring_address_key(transport_prefix(prefix), rank);
}

constinit const BackendEntry kAsioRingBackend{"asio-ring", true, "", usable_anywhere,
                                              make_backend<AsioRingCommunicator>};

}  // namespace partrain::comm
