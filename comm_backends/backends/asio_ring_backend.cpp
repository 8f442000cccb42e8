// The asio-ring backend: RingTransport + RingCollectives behind the Communicator contract.
//
// Naming the failed rank: in a ring only the neighbours of a dead or silent rank see it go;
// the others see *their* neighbour close its sockets or stop sending. So a rank that fails
// with PeerError(p) publishes "p failed me" in the store, then follows the chain of such
// reports (p's own report points further upstream) until it reaches a rank that published
// none within a short grace period: that one is blamed. Stall inspection of this kind is
// how Horovod names the ranks that are missing.
#include <algorithm>
#include <mutex>
#include <set>
#include <thread>

#include "comm_backends/backends/backend.h"
#include "comm_backends/ring/ring_allreduce.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {

namespace {

class AsioRingCommunicator : public Communicator {
 public:
  AsioRingCommunicator(const CommOptions& options, Store& store, int rank, int size,
                       const std::string& prefix)
      : transport_(store, rank, size,
                   RingTransportOptions{options.token, options.bind_host, prefix + "ring/",
                                        options.timeout}),
        ring_(transport_, options.timeout,
              options.ring_chunk_bytes > 0 ? options.ring_chunk_bytes : kDefaultRingChunkBytes),
        wire_(options.wire_dtype),
        store_(store),
        prefix_(prefix),
        grace_(std::clamp(options.timeout / 10, std::chrono::milliseconds(200),
                          std::chrono::milliseconds(2000))) {}

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
      const int culprit = trace_failure(e.peer_rank());
      if (culprit == e.peer_rank()) throw;
      throw PeerError(culprit, "asio-ring: rank " + std::to_string(culprit) +
                                   " failed first (traced through the other ranks' reports); "
                                   "here: " +
                                   e.what());
    }
  }

  int trace_failure(int peer) {
    const auto key = [this](int r) { return prefix_ + "failed/" + std::to_string(r); };
    try {
      const std::string mine = std::to_string(peer);
      store_.set(key(rank()), std::vector<std::uint8_t>(mine.begin(), mine.end()));
      const auto deadline = std::chrono::steady_clock::now() + grace_;
      std::set<int> visited{rank()};
      int suspect = peer;
      while (visited.insert(suspect).second) {
        while (!store_.check({key(suspect)}) && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        if (!store_.check({key(suspect)})) return suspect;  // no report: this one failed
        const auto report = store_.get(key(suspect));
        suspect = std::stoi(std::string(report.begin(), report.end()));
        if (suspect < 0 || suspect >= size()) return peer;
      }
      return peer;  // the reports go round in a circle: keep what we saw ourselves
    } catch (const std::exception&) {
      return peer;  // the store may have died with the failed rank
    }
  }

  std::mutex mutex_;  // one collective at a time: the byte streams carry them in order
  RingTransport transport_;
  RingCollectives ring_;
  DType wire_;
  Store& store_;
  std::string prefix_;
  std::chrono::milliseconds grace_;
};

}  // namespace

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
