#include "comm_backends/store/memory_store.h"

#include <string>

namespace partrain::comm {

MemoryStore::MemoryStore(const StoreOptions& options) : timeout_(options.timeout) {
  if (!options.join_key.empty()) values_[options.join_key] = options.join_value;
}

void MemoryStore::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  PARTRAIN_CHECK(!key.empty(), UsageError, "memory store: empty key");
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::vector<std::uint8_t> MemoryStore::get(const std::string& key) {
  const std::chrono::milliseconds bound = timeout_.load();
  std::unique_lock<std::mutex> lock(mutex_);
  // Bounded by the store's timeout: another thread of this process may set it meanwhile.
  const bool there = changed_.wait_for(lock, bound, [&] { return values_.count(key) > 0; });
  PARTRAIN_CHECK(there, CommError, "memory store: key '", key, "' was not set within ",
                 bound.count(), " ms (a lone rank's store: nobody else can set it)");
  return values_.at(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t value = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = values_.find(key); it != values_.end()) {
      try {
        value = std::stoll(std::string(it->second.begin(), it->second.end()));
      } catch (const std::exception&) {
        throw CommError("memory store: key '" + key + "' does not hold an integer");
      }
    }
    value += delta;
    const std::string text = std::to_string(value);
    values_[key].assign(text.begin(), text.end());
  }
  changed_.notify_all();
  return value;
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Bounded by `timeout`: another thread of this process may set them meanwhile.
  if (changed_.wait_for(lock, timeout, [&] { return missing(keys).empty(); })) return;
  throw CommError("memory store: keys missing after " + std::to_string(timeout.count()) +
                  " ms: " + missing(keys));
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  const std::lock_guard<std::mutex> lock(mutex_);
  return missing(keys).empty();
}

std::string MemoryStore::missing(const std::vector<std::string>& keys) const {
  std::string names;
  for (const std::string& key : keys) {
    if (values_.count(key) == 0) names += (names.empty() ? "" : ", ") + key;
  }
  return names;
}

}  // namespace partrain::comm
