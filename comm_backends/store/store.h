// defines: Store (rendezvous key-value store), StoreOptions, StoreUrl, parse_store_url(),
// open_store().
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

namespace partrain::comm {

struct StoreOptions {
  std::string token;  // run token; a peer without it is refused
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // bound on every wait
  int rank = 0;  // rank 0 hosts the tcp store server
  int world_size = 1;
  bool host_server = false;  // tcp: serve here (launcher or rank 0)
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
  // The store server's monotonic clock in nanoseconds, read in one round trip: a clock every
  // rank can hold its own against at once (trainer/observe/clock_sync.h). Null for a store
  // without a server (the file store).
  virtual std::optional<std::int64_t> server_clock_ns() { return std::nullopt; }
  virtual std::chrono::milliseconds timeout() const = 0;
  // Changes the bound on every later request and wait (a failure trace shortens it, so an
  // unreachable store costs a grace period, not a whole timeout).
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

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
