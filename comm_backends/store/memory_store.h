// defines: MemoryStore — a Store held in this process alone, for a lone rank (a world of one
// with no rendezvous): there is nobody to meet, so it needs no folder, port or server, and a
// process that ends abruptly leaves nothing behind. The threads of the process share it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm_backends/store/store.h"

namespace partrain::comm {

class MemoryStore : public Store {
 public:
  // options.join_key, where set, is set at once; the rest but the timeout is not needed.
  explicit MemoryStore(const StoreOptions& options);

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;
  std::vector<std::uint8_t> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return timeout_.load(); }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

 private:
  // The keys of `keys` not set yet, joined by ", "; empty when all are. Holds mutex_.
  std::string missing(const std::vector<std::string>& keys) const;

  // Atomic: a thread beside the one that sets it may make a request (a stop in the start-up
  // telling the others, StopRequest).
  std::atomic<std::chrono::milliseconds> timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;  // notified at every set() and add()
  std::map<std::string, std::vector<std::uint8_t>> values_;
};

}  // namespace partrain::comm
