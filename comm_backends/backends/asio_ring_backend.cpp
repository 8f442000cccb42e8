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
  AsioRingCommunicator(const CommOptions& options, Store& store, int rank, int size,
                       const std::string& prefix)
      : transport_(store, rank, size,
                   RingTransportOptions{options.token, options.bind_host, transport_prefix(prefix),
                                        options.timeout}),
        ring_(transport_, options.timeout,
              options.ring_chunk_bytes > 0 ? options.ring_chunk_bytes : kDefaultRingChunkBytes),
        wire_(options.wire_dtype),
        store_(store),
        prefix_(prefix),
        grace_(failure_grace(options.timeout)),
        timeout_(options.timeout) {}

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

Backend asio_ring_backend() {
  Backend backend;
  backend.name = "asio-ring";
  backend.compiled_in = true;
  backend.usable = [](const CommOptions& options) { return options.device == DeviceKind::cpu; };
  backend.make = [](const CommOptions& options, Store& store, int rank, int size,
                    const std::string& prefix) -> std::unique_ptr<Communicator> {
    return std::make_unique<AsioRingCommunicator>(options, store, rank, size, prefix);
  };
  return backend;
}

}  // namespace partrain::comm
