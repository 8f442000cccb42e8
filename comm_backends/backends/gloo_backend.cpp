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
#include <gloo/reduce_scatter.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdint>
#include <list>
#include <cstring>
#include <exception>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "comm_backends/store/store_barrier.h"
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

// The most a rank going on an error of its own waits to set PREFIX/gone, and a rank that built
// an algorithm waits to look for it (Note [A peer gone before the algorithm was built]).
constexpr std::chrono::milliseconds kGoneSetBound{2000};

// An allgather whose output is at most this size runs on an algorithm kept from call to call,
// on a scratch buffer of our own, as allreduce does; a larger one is built per call. At two
// ranks on loopback (`partrain bench allreduce --backend gloo --collective allgather --world 2
// --timing loop`, 2026-12-07) kept took 78-104 us at 16 KiB and 106-108 at 64 KiB against
// 122 and 134-140 built per call; at 256 KiB the two were even, and at 1 MiB the copies in and
// out cost more (415-567 us kept, 348-354 built).
constexpr std::size_t kKeptAllgatherBytes = std::size_t{128} << 10;

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(const BackendArgs& args)
      : store_(args.store),
        prefix_(args.prefix),
        context_(std::make_shared<gloo::rendezvous::Context>(args.rank, args.size())) {
    // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that died would kill this
    // process with SIGPIPE instead of failing the collective (Python ignores SIGPIPE, so
    // PyTorch never sees it). Keep a handler someone installed; replace only the default.
    if (struct sigaction current{};
        sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      std::signal(SIGPIPE, SIG_IGN);
    }
    gloo::transport::tcp::attr attr;
    attr.hostname = args.options.bind_host;
    attr.ai_family = args.options.bind_host.find(':') != std::string::npos ? AF_INET6 : AF_INET;
    guard("connecting", [&] {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      timeout_ = args.options.timeout;
      context_->setTimeout(args.options.timeout);
      GlooStore gloo_store(store_, prefix_, args.options.timeout);
      context_->connectFullMesh(gloo_store, device);
    });
    publish_address();
  }

  // Gloo closes its sockets on destruction, and a peer still finishing the last collective
  // (waiting for its own sends to complete) would see "connection closed". So ranks leave
  // together: a store barrier, bounded briefly. Not where this rank unwinds from an error of its
  // own (its data missing, its disk full; a peer's failure would have set failed_): the others
  // are not coming to the barrier, and leaving at once is what tells them.
  ~GlooCommunicator() override {
    if (failed_ || size() == 1) return;
    if (std::uncaught_exceptions() > 0) {
      // Before its sockets close: a peer that builds an algorithm after they closed finds this
      // (look_for_a_rank_gone()). Briefly: the store may be gone too.
      const std::string me = std::to_string(rank());
      try_set(store_, prefix_ + "gone", std::vector<std::uint8_t>(me.begin(), me.end()),
              kGoneSetBound);
      return;
    }
    try {
      store_barrier(store_, prefix_ + "closing", rank(), size(),
                    std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10)));
    } catch (const std::exception&) {
      // A peer is gone: nobody is left to disturb.
    }
  }

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::string name() const override { return "gloo"; }
  Capabilities capabilities() const override {
    return {.host_memory = true, .device_memory = false, .native_reduce_scatter = true};
  }
  std::string last_algorithm() const override { return last_algorithm_; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    PARTRAIN_CHECK(buffer.count <= static_cast<std::size_t>(INT_MAX), UsageError,
                   "gloo: allreduce of ", buffer.count, " elements is over Gloo's int limit");
    if (size() > 1) by_type(buffer.dtype, [](auto) {});  // refused whatever the count
    start_call();
    if (size() == 1 || buffer.count == 0) return;
    guard("allreduce", [&] {
      by_type(buffer.dtype,
              [&](auto type) { reduce<decltype(type)>(Kind::allreduce, buffer, buffer, op); });
    });
    if (op == ReduceOp::avg) divide(buffer);
  }

  // Gloo's ReduceScatterHalvingDoubling, on a copy of the input (it reduces in place).
  void reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) override {
    PARTRAIN_CHECK(in.count <= static_cast<std::size_t>(INT_MAX), UsageError,
                   "gloo: reduce_scatter of ", in.count, " elements is over Gloo's int limit");
    if (size() > 1) by_type(in.dtype, [](auto) {});
    start_call();
    if (out.count == 0) return;
    if (size() == 1) {
      std::memmove(out.data, in.data, out.bytes());
      return;
    }
    guard("reduce_scatter", [&] {
      by_type(in.dtype,
              [&](auto type) { reduce<decltype(type)>(Kind::reduce_scatter, in, out, op); });
    });
    if (op == ReduceOp::avg) divide(out);
  }

  // Built per call: broadcasts come at the start and on resuming, not in the steps.
  void broadcast(Buffer buffer, int root) override {
    start_call();
    if (size() == 1 || buffer.count == 0) return;
    last_algorithm_ = "one_to_all";
    guard("broadcast", [&] {
      std::vector<std::uint8_t*> pointers{static_cast<std::uint8_t*>(buffer.data)};
      gloo::BroadcastOneToAll<std::uint8_t> one_to_all(context_, pointers, buffer.bytes(), root);
      look_for_a_rank_gone();
      one_to_all.run();
    });
  }

  void allgather(const Buffer& in, Buffer out) override {
    PARTRAIN_CHECK(in.bytes() <= static_cast<std::size_t>(INT_MAX), UsageError,
                   "gloo: allgather of ", in.bytes(), " bytes is over Gloo's int limit");
    start_call();
    if (in.count == 0) return;
    if (size() == 1) {
      std::memmove(out.data, in.data, in.bytes());
      return;
    }
    last_algorithm_ = "ring";
    const int bytes = static_cast<int>(in.bytes());
    guard("allgather", [&] {
      if (out.bytes() <= kKeptAllgatherBytes) {
        // The scratch holds the output, then this rank's input: Gloo copies the input into its
        // block of the output with memcpy, which must not see the two be one.
        Kept& entry = kept(Kind::allgather, in.count, in.dtype, ReduceOp::sum,
                           out.bytes() + in.bytes(), [&](std::uint8_t* scratch) -> Built {
                             std::vector<const std::uint8_t*> inputs{scratch + out.bytes()};
                             return {std::make_unique<gloo::AllgatherRing<std::uint8_t>>(
                                         context_, inputs, scratch, bytes),
                                     "ring"};
                           });
        std::memcpy(entry.scratch.data() + out.bytes(), in.data, in.bytes());
        entry.algorithm->run();
        std::memcpy(out.data, entry.scratch.data(), out.bytes());
        return;
      }
      // In place (the input is this rank's block of the output): the input goes through a copy.
      const auto* source = static_cast<const std::uint8_t*>(in.data);
      if (source == static_cast<const std::uint8_t*>(out.data) + rank() * in.bytes()) {
        in_place_.assign(source, source + in.bytes());
        source = in_place_.data();
      }
      std::vector<const std::uint8_t*> inputs{source};
      gloo::AllgatherRing<std::uint8_t> ring(context_, inputs, static_cast<std::uint8_t*>(out.data),
                                             bytes);
      look_for_a_rank_gone();
      ring.run();
    });
  }

  // One kept algorithm: barriers come at every checkpoint and evaluation.
  void barrier() override {
    start_call();
    if (size() == 1) return;
    last_algorithm_ = "all_to_all";
    guard("barrier", [&] {
      if (!barrier_) {
        barrier_ = std::make_unique<gloo::BarrierAllToAll>(context_);
        look_for_a_rank_gone();
      }
      barrier_->run();
    });
  }

 private:
  // Gloo's algorithm objects register their buffers when built, which costs far more than a
  // small allreduce. So they are built once per (kind, count, dtype, op) on a scratch buffer
  // of our own and kept; a call copies in, runs, copies out. The key holds no pointer, so
  // every rank makes the same hit/miss/evict decisions — it must, since building one takes
  // slots from the context in step with the peers.
  enum class Kind { allreduce, reduce_scatter, allgather };
  struct Kept {
    Kind kind;
    std::size_t count;
    DType dtype;
    ReduceOp op;
    std::vector<std::uint8_t> scratch;
    std::unique_ptr<gloo::Algorithm> algorithm;
    const char* name;
  };

  // An algorithm as it is built, and its name for last_algorithm().
  struct Built {
    std::unique_ptr<gloo::Algorithm> algorithm;
    const char* name;
  };

  // The kept algorithm for the key, most recently used first; where there is none, make(SCRATCH)
  // builds it on a scratch buffer of `scratch_bytes`.
  template <typename Make>
  Kept& kept(Kind kind, std::size_t count, DType dtype, ReduceOp op, std::size_t scratch_bytes,
             Make&& make) {
    auto hit = std::find_if(cache_.begin(), cache_.end(), [&](const Kept& k) {
      return k.kind == kind && k.count == count && k.dtype == dtype && k.op == op;
    });
    if (hit != cache_.end()) {
      if (hit != cache_.begin()) cache_.splice(cache_.begin(), cache_, hit);
      return cache_.front();
    }
    Kept entry{kind, count, dtype, op, std::vector<std::uint8_t>(scratch_bytes), nullptr, nullptr};
    Built built = make(entry.scratch.data());  // the vector's storage moves with the entry
    entry.algorithm = std::move(built.algorithm);
    entry.name = built.name;
    cache_.push_front(std::move(entry));
    std::size_t bytes = 0;
    for (const auto& k : cache_) bytes += k.scratch.size();
    while (cache_.size() > 1 && (cache_.size() > kCacheEntries || bytes > kCacheBytes)) {
      bytes -= cache_.back().scratch.size();
      cache_.pop_back();
    }
    look_for_a_rank_gone();
    return cache_.front();
  }

  std::vector<std::uint8_t> in_place_;  // an in-place allgather's input

  // Calls f(T{}) with the Gloo element type of `dtype`.
  template <typename F>
  static void by_type(DType dtype, F&& f) {
    switch (dtype) {
      case DType::f32:
        return f(float{});
      case DType::f64:
        return f(double{});
      case DType::f16:
        return f(gloo::float16{});
      case DType::i32:
        return f(std::int32_t{});
      case DType::i64:
        return f(std::int64_t{});
      case DType::bf16:
        throw UsageError(
            "comm backend 'gloo' cannot reduce bf16 (this Gloo has no bfloat16 type); use "
            "asio-ring, or f32/f16 buffers");
    }
  }
  static constexpr std::size_t kCacheEntries = 16;
  static constexpr std::size_t kCacheBytes = std::size_t{512} << 20;

  // `in` reduced (allreduce: in place, in == out; reduce_scatter: this rank's block to out).
  template <typename T>
  void reduce(Kind kind, const Buffer& in, const Buffer& out, ReduceOp op) {
    const gloo::ReductionFunction<T>* fn = gloo::ReductionFunction<T>::sum;
    if (op == ReduceOp::min) fn = gloo::ReductionFunction<T>::min;
    if (op == ReduceOp::max) fn = gloo::ReductionFunction<T>::max;
    const int count = static_cast<int>(in.count);
    Kept& entry =
        kept(kind, in.count, in.dtype, op, in.bytes(), [&](std::uint8_t* scratch) -> Built {
          std::vector<T*> pointers{reinterpret_cast<T*>(scratch)};
          if (kind == Kind::reduce_scatter) {
            return {std::make_unique<gloo::ReduceScatterHalvingDoubling<T>>(
                        context_, pointers, count,
                        std::vector<int>(size(), static_cast<int>(out.count)), fn),
                    "halving_doubling"};
          }
          if (in.bytes() < kSmallMessageBytes) {
            return {
                std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context_, pointers, count, fn),
                "halving_doubling"};
          }
          if (size() == 2 || (size() & (size() - 1)) != 0) {  // two ranks, or not a power of 2
            return {std::make_unique<gloo::AllreduceRingChunked<T>>(context_, pointers, count, fn),
                    "ring_chunked"};
          }
          return {std::make_unique<gloo::AllreduceBcube<T>>(context_, pointers, count, fn),
                  "bcube"};
        });
    std::memcpy(entry.scratch.data(), in.data, in.bytes());
    entry.algorithm->run();
    // Gloo's reduce-scatter leaves this rank's block at the start of the buffer.
    std::memcpy(out.data, entry.scratch.data(), out.bytes());
    last_algorithm_ = entry.name;
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

  // Gloo's errors name the peer by an address ("[10.0.0.2]:40711"): the one that peer
  // advertised for the pair (its listener for that pair, closed again if the peer was the
  // side that connected), or the peer's end of the connection. So each rank publishes what
  // it advertised to every peer and every TCP endpoint it holds once the mesh is connected,
  // and a failure maps the address back to the one rank that published it.
  void publish_address() {
    if (size() == 1) return;
    std::string mine;
    for (int r = 0; r < size(); ++r) {
      if (r != rank()) mine += context_->getPair(r)->address().str() + "\n";
    }
    for (const auto& endpoint : local_tcp_endpoints()) mine += endpoint + "\n";
    store_.set(prefix_ + "address/" + std::to_string(rank()),
               std::vector<std::uint8_t>(mine.begin(), mine.end()));
    // Read back now: when a link fails, the store may be on the far side of it.
    peer_addresses_.resize(size());
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      const auto value = store_.get(prefix_ + "address/" + std::to_string(r));
      peer_addresses_[r] = "\n" + std::string(value.begin(), value.end());
    }
  }

  // "[host]:port" for each connected or listening TCP socket of this process, the way
  // Gloo's Address::str() writes them. The scan is bounded by the descriptor table.
  static std::vector<std::string> local_tcp_endpoints() {
    std::vector<std::string> endpoints;
    const long limit = std::min<long>(sysconf(_SC_OPEN_MAX), 65536);
    for (int fd = 0; fd < limit; ++fd) {
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      int type = 0;
      socklen_t type_length = sizeof type;
      if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 || type != SOCK_STREAM) {
        continue;
      }
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
      char host[INET6_ADDRSTRLEN] = {};
      int port = 0;
      if (address.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
      } else if (address.ss_family == AF_INET6) {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
      } else {
        continue;
      }
      endpoints.push_back("[" + std::string(host) + "]:" + std::to_string(port));
    }
    return endpoints;
  }

  // The rank that holds the endpoint the message names (a port of at most five digits, which
  // std::stoi reads without overflow); -1 when it names none we know.
  int rank_named_in(const std::string& message) {
    static const std::regex kAddress(R"((\[[^\]]+\]):([0-9]{1,5})\b)");
    std::smatch match;
    if (!std::regex_search(message, match, kAddress)) return -1;
    // This libgloo prints the port as it sits in the socket address, in network byte order
    // ("[127.0.0.1]:5304" for port 47124): try it both ways round.
    const int port = std::stoi(match[2].str()) & 0xffff;
    const int swapped = ((port & 0xff) << 8) | (port >> 8);
    const std::string names[2] = {match[1].str() + ":" + std::to_string(port) + "\n",
                                  match[1].str() + ":" + std::to_string(swapped) + "\n"};
    for (int r = 0; r < static_cast<int>(peer_addresses_.size()); ++r) {
      for (const auto& named : names) {
        if (r != rank() && peer_addresses_[r].find("\n" + named) != std::string::npos) return r;
      }
    }
    return -1;
  }

  // Every collective starts here: none has run an algorithm yet.
  void start_call() { last_algorithm_ = "none"; }

  // Note [A peer gone before the algorithm was built]
  // This Gloo (2022) signals a closed connection only to the buffers registered at the time: a
  // buffer an algorithm registers after its peer's socket closed waits out the whole timeout
  // (then says "Connection closed by peer"). A rank that fails on its own (its data missing on
  // its host before the first collective, its disk full at a checkpoint) closes while the
  // others may be building their next algorithm: in 2 of 12 runs by hand at two ranks, rank 0
  // waited the 20 s timeout at the first collective. So such a rank sets PREFIX/gone before its
  // sockets close, and a rank looks for it each time it has built an algorithm, after the
  // algorithm registered its buffers and before it runs: set by then, the rank is gone; not
  // set, its close comes later and reaches the registered buffers. A kept algorithm (allreduce,
  // reduce-scatter, a small allgather, the barrier) is looked for once, when built; one built
  // per call (a broadcast, a large allgather) costs one store request a call.
  void look_for_a_rank_gone() {
    // Not set, or the store cannot say: the collective's own wait decides.
    const auto who = try_get(store_, prefix_ + "gone", kGoneSetBound);
    if (!who) return;
    int gone = 0;
    try {
      gone = std::stoi(std::string(who->begin(), who->end()));
    } catch (const std::exception&) {
      return;
    }
    failed_ = true;
    throw PeerError(
        gone, "gloo: rank " + std::to_string(gone) + " has left: it failed" + kItsOwnOutputSaysWhy);
  }

  // With two ranks the peer is known. With more, the message names an address, which may be
  // that of a survivor that is itself stuck on the failed one, or none (-1): either way the
  // other ranks' reports tell (CheckedCommunicator, failure_trace.h).
  [[noreturn]] void fail(const char* what, const std::string& message) {
    failed_ = true;
    const int blamed = size() == 2 ? 1 - rank() : rank_named_in(message);
    throw PeerError(blamed, std::string("gloo: ") + what + " failed: " + message);
  }

  comm::Store& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_{0};
  bool failed_ = false;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<std::string> peer_addresses_;  // by rank: "\n"-led lines of its endpoints
  std::list<Kept> cache_;                    // most recently used first; dies before context_
  std::unique_ptr<gloo::BarrierAllToAll>
      barrier_;  // made at the first barrier; dies before context_
  std::string last_algorithm_ = "none";
};

}  // namespace

constinit const BackendEntry kGlooBackend{"gloo", true, "", usable_anywhere,
                                          make_backend<GlooCommunicator>};

}  // namespace partrain::comm

#else  // not compiled in: still a known name, with a clear way forward

namespace partrain::comm {
constinit const BackendEntry kGlooBackend{
    "gloo", false,
    "install libgloo (Debian: libgloo-dev) and rebuild with -DPARTRAIN_WITH_GLOO=ON, or use "
    "asio-ring",
    nullptr, nullptr};
}  // namespace partrain::comm

#endif
