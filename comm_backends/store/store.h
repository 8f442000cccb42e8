// defines: Store (rendezvous key-value store), MasterStoppedError, ScopedStoreTimeout, try_set(),
// try_get(), StoreOptions, StoreUrl, parse_store_url(), open_store().
//
// A store is how ranks find each other before any collective runs: the NCCL unique id,
// Gloo's pair addresses and the ring's listening ports travel through it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace partrain::comm {

struct StoreOptions {
  std::string token;  // run token; a peer without it is refused
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // bound on every wait
  int rank = 0;  // rank 0 hosts the tcp store server
  int world_size = 1;
  bool host_server = false;  // tcp: serve here (launcher or rank 0)
  // tcp: a server whose steady clock is this process's (same boot, steady_clock_identity())
  // is read here, exactly; false reads it through round trips whatever it shares (tests and
  // benchmarks of that path).
  bool read_shared_clock_here = true;
  // A key this client sets as it joins (empty: none). A tcp client sends it in its hello
  // (kStoreJoinMagic), which the server takes as it takes the token: no request, no round trip
  // (the value at most kMaxJoinValueBytes, 1 KiB); a file store sets it once its session is
  // open. What every rank publishes about itself at join goes here (open_rank_group()).
  std::string join_key;
  std::vector<std::uint8_t> join_value;
};

// One reading of a store server's monotonic clock, `server_ns` nanoseconds, taken between
// `sent` and `received` on this process's steady clock.
struct ServerClockReading {
  std::chrono::steady_clock::time_point sent;
  std::chrono::steady_clock::time_point received;
  std::int64_t server_ns = 0;
  std::chrono::steady_clock::duration round_trip() const { return received - sent; }
};

// What a store client is told by a master node that could not start and stands in for its
// store (kStoreFailed): "the master at ADDR:PORT says: LINE". There is no store behind it, so a
// rank that gets it tells nobody why it stops.
class MasterStoppedError : public UsageError {
 public:
  using UsageError::UsageError;
};

// The process serving a store with a server, as the server told each client at its hello: whom
// it serves as ("rank 0"; empty where it did not say) and its process mark
// (encode_process_mark(), shm/host_identity.h): where a client shares its machine, what the
// process does can be seen even when the server no longer answers.
struct StoreServerProcess {
  std::string role;
  std::string mark;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<std::uint8_t>& value) = 0;
  // Waits up to the store's timeout for the key; throws CommError naming the key on timeout.
  virtual std::vector<std::uint8_t> get(const std::string& key) = 0;
  // Atomically adds delta to the integer under key (0 if absent); returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Waits until every key exists, or throws CommError naming the missing ones.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // The values of every key, in order, once all exist (waiting up to the store's timeout);
  // CommError naming a missing key on timeout. One round trip on the tcp store however many
  // keys; this default asks for each in turn.
  virtual std::vector<std::vector<std::uint8_t>> get_many(const std::vector<std::string>& keys) {
    std::vector<std::vector<std::uint8_t>> values;
    values.reserve(keys.size());
    for (const auto& key : keys) values.push_back(get(key));
    return values;
  }
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // The best (shortest round trip) of at least `readings` readings of the store server's
  // monotonic clock: a clock every rank can hold its own against at once
  // (trainer/observe/clock_sync.h). Every answer of a store with a server carries a reading,
  // so only the readings still missing cost a round trip each. Null for a store without a
  // server (the file store).
  virtual std::optional<ServerClockReading> server_clock(int /*readings*/) { return std::nullopt; }
  // The lines that partrain processes which could not join the run told the server this
  // process hosts (tell_tcp_store() in tcp_store.h), in the order they came; empty where this
  // process hosts none.
  virtual std::vector<std::string> notices() const { return {}; }
  // The process serving this store, as its server said; nullopt for a store without a server
  // (the file store) or a server that did not say.
  virtual std::optional<StoreServerProcess> server_process() const { return std::nullopt; }
  virtual std::chrono::milliseconds timeout() const = 0;
  // Changes the bound on every later request and wait (a failure trace shortens it, so an
  // unreachable store costs a grace period, not a whole timeout).
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

// The store's bound on every request and wait set to `bound` while this lives, and the bound
// before put back when it goes: a failure path that asks a store which may be gone (or frozen)
// waits that long, not a whole timeout.
class ScopedStoreTimeout {
 public:
  ScopedStoreTimeout(Store& store, std::chrono::milliseconds bound)
      : store_(store), before_(store.timeout()) {
    store_.set_timeout(bound);
  }
  ~ScopedStoreTimeout() { store_.set_timeout(before_); }
  ScopedStoreTimeout(const ScopedStoreTimeout&) = delete;
  ScopedStoreTimeout& operator=(const ScopedStoreTimeout&) = delete;

 private:
  Store& store_;
  std::chrono::milliseconds before_;
};

// For a rank that is going, or failing: sets `key` with no request waiting longer than `bound`
// (nor the store's own timeout), and a store that cannot take it (gone with the rank that served
// it, or frozen) is no error. Never throws.
void try_set(Store& store, const std::string& key, const std::vector<std::uint8_t>& value,
             std::chrono::milliseconds bound);
// The value of `key` where it is set now, without waiting for it; nullopt where it is not, or
// where the store cannot say within `bound` (nor its own timeout). Never throws.
std::optional<std::vector<std::uint8_t>> try_get(Store& store, const std::string& key,
                                                 std::chrono::milliseconds bound);

// A parsed store url. env:// comes back as tcp, read from MASTER_ADDR / MASTER_PORT.
struct StoreUrl {
  enum class Kind { file, tcp } kind = Kind::file;
  std::string path;  // file: the directory, as the OS spells it (C:/tmp/x or /tmp/x)
  std::string host;  // tcp
  int port = 0;      // tcp
};
StoreUrl parse_store_url(const std::string& url);  // throws UsageError naming the problem

// url: file://DIR (file:///tmp/x, file:///C:/tmp/x), tcp://HOST:PORT, env:// (MASTER_ADDR,
// MASTER_PORT). Throws UsageError for a malformed url.
std::unique_ptr<Store> open_store(const std::string& url, const StoreOptions& options);

}  // namespace partrain::comm
