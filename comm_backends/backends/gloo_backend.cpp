// The gloo backend: Debian's libgloo with its TCP transport, rendezvous through our Store.
//
// It uses Gloo's algorithm classes (AllreduceHalvingDoubling, AllreduceRingChunked,
// AllreduceBcube), picked per message size, and not the newer gloo::allreduce() entry point:
// in the libgloo we build against that one shrinks the socket send buffer and stalls every
// large write for about 40 ms.
#include "comm_backends/backends/backend.h"
#include "common/errors.h"

#ifdef PARTRAIN_WITH_GLOO

#include <gloo/allgather_ring.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <list>
#include <mutex>

#include "comm_backends/reduction.h"
#include "comm_backends/store/store.h"

namespace partrain::comm {

namespace {

// Gloo's rendezvous sees our Store under this communicator's key prefix.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(comm::Store& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefix_ + key, std::vector<std::uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key});
    auto value = store_.get(prefix_ + key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    for (const auto& key : keys) prefixed.push_back(prefix_ + key);
    store_.wait(prefixed, timeout);
  }

 private:
  comm::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// Below this size the latency-bound halving-doubling wins; above it the bandwidth-bound
// ring-chunked (two ranks) or bcube (a power-of-two world) does, as measured on loopback.
constexpr std::size_t kSmallMessageBytes = 256 << 10;

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const CommOptions& options, comm::Store& store, int rank, int size,
                   const std::string& prefix)
      : store_(store),
        prefix_(prefix),
        context_(std::make_shared<gloo::rendezvous::Context>(rank, size)) {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_host;
    attr.ai_family = options.bind_host.find(':') != std::string::npos ? AF_INET6 : AF_INET;
    guard("connecting", [&] {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      timeout_ = options.timeout;
      context_->setTimeout(options.timeout);
      GlooStore gloo_store(store, prefix, options.timeout);
      context_->connectFullMesh(gloo_store, device);
    });
  }

  // Gloo closes its sockets on destruction, and a peer still finishing the last collective
  // (waiting for its own sends to complete) would see "connection closed". So ranks leave
  // together: each says so in the store and waits, briefly, for the others.
  ~GlooCommunicator() override {
    if (failed_ || size() == 1) return;
    try {
      store_.set(prefix_ + "closing/" + std::to_string(rank()), {1});
      std::vector<std::string> keys;
      for (int r = 0; r < size(); ++r) keys.push_back(prefix_ + "closing/" + std::to_string(r));
      store_.wait(keys, std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10)));
    } catch (const std::exception&) {
      // A peer is gone: nobody is left to disturb.
    }
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::string name() const override { return "gloo"; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    check_host_buffer(buffer, name());
    PARTRAIN_CHECK(buffer.count <= static_cast<std::size_t>(INT_MAX), UsageError,
                   "gloo: allreduce of ", buffer.count, " elements is over Gloo's int limit");
    std::lock_guard<std::mutex> lock(mutex_);
    if (size() == 1 || buffer.count == 0) return;
    guard("allreduce", [&] {
      switch (buffer.dtype) {
        case DType::f32:
          return reduce<float>(buffer, op);
        case DType::f64:
          return reduce<double>(buffer, op);
        case DType::f16:
          return reduce<gloo::float16>(buffer, op);
        case DType::i32:
          return reduce<std::int32_t>(buffer, op);
        case DType::i64:
          return reduce<std::int64_t>(buffer, op);
        case DType::bf16:
          throw UsageError(
              "comm backend 'gloo' cannot reduce bf16 (this Gloo has no bfloat16 type); use "
              "asio-ring, or f32/f16 buffers");
      }
    });
    if (op == ReduceOp::avg) divide(buffer);
  }

  void broadcast(Buffer buffer, int root) override {
    check_host_buffer(buffer, name());
    PARTRAIN_CHECK(root >= 0 && root < size(), UsageError, "broadcast: root ", root,
                   " is outside a world of ", size());
    std::lock_guard<std::mutex> lock(mutex_);
    if (size() == 1 || buffer.count == 0) return;
    guard("broadcast", [&] {
      std::vector<std::uint8_t*> pointers{static_cast<std::uint8_t*>(buffer.data)};
      gloo::BroadcastOneToAll<std::uint8_t>(context_, pointers, buffer.bytes(), root).run();
    });
  }

  void allgather(const Buffer& in, Buffer out) override {
    check_host_buffer(in, name());
    check_host_buffer(out, name());
    check_allgather_buffers(in, out, size());
    PARTRAIN_CHECK(in.bytes() <= static_cast<std::size_t>(INT_MAX), UsageError,
                   "gloo: allgather of ", in.bytes(), " bytes is over Gloo's int limit");
    std::lock_guard<std::mutex> lock(mutex_);
    if (in.count == 0) return;
    if (size() == 1) {
      std::memmove(out.data, in.data, in.bytes());
      return;
    }
    guard("allgather", [&] {
      std::vector<const std::uint8_t*> inputs{static_cast<const std::uint8_t*>(in.data)};
      gloo::AllgatherRing<std::uint8_t>(context_, inputs, static_cast<std::uint8_t*>(out.data),
                                        static_cast<int>(in.bytes()))
          .run();
    });
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (size() == 1) return;
    guard("barrier", [&] { gloo::BarrierAllToAll(context_).run(); });
  }

 private:
  // Gloo's algorithm objects register their buffers when built, which costs far more than a
  // small allreduce. So they are built once per (count, dtype, op) on a scratch buffer of our
  // own and kept; a call copies in, runs, copies out. The key holds no pointer, so every rank
  // makes the same hit/miss/evict decisions — it must, since building one takes slots from
  // the context in step with the peers.
  struct CachedAllreduce {
    std::size_t count;
    DType dtype;
    ReduceOp op;
    std::vector<std::uint8_t> scratch;
    std::unique_ptr<gloo::Algorithm> algorithm;
  };
  static constexpr std::size_t kCacheEntries = 16;
  static constexpr std::size_t kCacheBytes = std::size_t{512} << 20;

  template <typename T>
  void reduce(const Buffer& buffer, ReduceOp op) {
    auto hit = std::find_if(cache_.begin(), cache_.end(), [&](const CachedAllreduce& c) {
      return c.count == buffer.count && c.dtype == buffer.dtype && c.op == op;
    });
    if (hit == cache_.end()) {
      CachedAllreduce entry{buffer.count, buffer.dtype, op,
                            std::vector<std::uint8_t>(buffer.bytes()), nullptr};
      const gloo::ReductionFunction<T>* fn = gloo::ReductionFunction<T>::sum;
      if (op == ReduceOp::min) fn = gloo::ReductionFunction<T>::min;
      if (op == ReduceOp::max) fn = gloo::ReductionFunction<T>::max;
      std::vector<T*> pointers{reinterpret_cast<T*>(entry.scratch.data())};
      const int count = static_cast<int>(buffer.count);
      const bool power_of_two = (size() & (size() - 1)) == 0;
      if (buffer.bytes() < kSmallMessageBytes) {
        entry.algorithm =
            std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context_, pointers, count, fn);
      } else if (size() == 2 || !power_of_two) {
        entry.algorithm =
            std::make_unique<gloo::AllreduceRingChunked<T>>(context_, pointers, count, fn);
      } else {
        entry.algorithm = std::make_unique<gloo::AllreduceBcube<T>>(context_, pointers, count, fn);
      }
      cache_.push_front(std::move(entry));
      std::size_t bytes = 0;
      for (const auto& c : cache_) bytes += c.scratch.size();
      while (cache_.size() > 1 && (cache_.size() > kCacheEntries || bytes > kCacheBytes)) {
        bytes -= cache_.back().scratch.size();
        cache_.pop_back();
      }
      hit = cache_.begin();
    } else if (hit != cache_.begin()) {
      cache_.splice(cache_.begin(), cache_, hit);
      hit = cache_.begin();
    }
    std::memcpy(hit->scratch.data(), buffer.data, buffer.bytes());
    hit->algorithm->run();
    std::memcpy(buffer.data, hit->scratch.data(), buffer.bytes());
  }

  void divide(const Buffer& buffer) {
    if (buffer.dtype != DType::f16) {
      divide_elements(buffer.data, buffer.dtype, buffer.count, size());
      return;
    }
    auto* bits = static_cast<std::uint16_t*>(buffer.data);
    for (std::size_t i = 0; i < buffer.count; ++i) {
      bits[i] = float_to_half(half_to_float(bits[i]) / static_cast<float>(size()));
    }
  }

  // Gloo reports failures with its own exception types; ours name what failed and, where
  // it can be known, the peer.
  template <typename F>
  void guard(const char* what, F&& body) {
    try {
      body();
    } catch (const partrain::Error&) {
      throw;
    } catch (const gloo::IoException& e) {
      fail(what, e.what());
    } catch (const gloo::Exception& e) {
      fail(what, e.what());
    } catch (const gloo::EnforceNotMet& e) {
      fail(what, e.what());
    }
  }

  [[noreturn]] void fail(const char* what, const std::string& message) {
    failed_ = true;
    const std::string text = std::string("gloo: ") + what + " failed: " + message;
    // With two ranks the peer is known; with more, Gloo's message names only an address.
    if (context_->size == 2) {
      throw PeerError(1 - context_->rank,
                      text + " (peer rank " + std::to_string(1 - context_->rank) + ")");
    }
    throw CommError(text);
  }

  std::mutex mutex_;
  comm::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_{0};
  bool failed_ = false;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::list<CachedAllreduce> cache_;  // most recently used first; dies before context_
};

}  // namespace

Backend gloo_backend() {
  Backend backend;
  backend.name = "gloo";
  backend.compiled_in = true;
  backend.usable = [](const CommOptions&) { return false; };
  backend.make = [](const CommOptions& options, Store& store, int rank, int size,
                    const std::string& prefix) -> std::unique_ptr<Communicator> {
    return std::make_unique<GlooCommunicator>(options, store, rank, size, prefix);
  };
  return backend;
}

}  // namespace partrain::comm

#else  // not compiled in: still a known name, with a clear way forward

namespace partrain::comm {
Backend gloo_backend() {
  Backend backend;
  backend.name = "gloo";
  backend.how_to_get =
      "install libgloo (Debian: libgloo-dev) and rebuild with -DPARTRAIN_WITH_GLOO=ON, or use "
      "asio-ring";
  return backend;
}
}  // namespace partrain::comm

#endif
