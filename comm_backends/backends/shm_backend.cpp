// The shm backend: ShmCollectives over a region of shared memory (Boost.Interprocess), for
// ranks that all run on one host.
//
// Setup through the store: every rank publishes its host identity and checks that all are
// the same; rank 0 creates the region, owner-only, under a name made of the run token, the
// communicator's store prefix and random bits, and publishes the name; the others map it and
// say so; then rank 0 removes the name (POSIX), so the region lives exactly as long as the
// ranks' mappings and nothing is left behind however the run ends. On Windows the kernel
// removes a mapping with its last handle.
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#if defined(_WIN32)
#include <boost/interprocess/windows_shared_memory.hpp>
#else
#include <boost/interprocess/shared_memory_object.hpp>
#endif

#include <memory>
#include <mutex>
#include <random>
#include <sstream>

#include "comm_backends/backends/backend.h"
#include "comm_backends/shm/host_identity.h"
#include "comm_backends/shm/shm_collectives.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "common/hash.h"

namespace partrain::comm {
namespace {

namespace bip = boost::interprocess;

#if defined(_WIN32)
using SharedMemory = bip::windows_shared_memory;
#else
using SharedMemory = bip::shared_memory_object;
#endif

std::vector<std::uint8_t> bytes_of(const std::string& text) {
  return std::vector<std::uint8_t>(text.begin(), text.end());
}
std::string text_of(const std::vector<std::uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::string region_name(const CommOptions& options, const std::string& prefix) {
  std::random_device random;
  std::ostringstream name;
  name << "partrain-shm-" << std::hex << fnv1a_64(options.token) << "-" << fnv1a_64(prefix) << "-"
       << random() << random();
  return name.str();
}

// Every rank on this rank's host, or a UsageError naming one that is not.
void check_one_host(Store& store, const std::string& prefix, int rank, int size) {
  const auto other = rank_on_another_host(store, prefix + "host/", rank, size);
  PARTRAIN_CHECK(!other, UsageError, "comm backend 'shm' needs every rank on one host, but rank ",
                 other->rank, " runs on '", other->identity, "' and rank ", rank, " on '",
                 host_identity(), "'; use asio-ring or gloo across hosts");
}

// The region's name on rank 0, removed once (not the region: mappings keep it) when the
// others have mapped it, or at the latest when this goes, also if setup fails half way.
class RegionName {
 public:
  RegionName() = default;
  RegionName(const RegionName&) = delete;
  RegionName& operator=(const RegionName&) = delete;
  ~RegionName() { remove(); }
  void own(std::string name) {
    name_ = std::move(name);
    owned_ = true;
  }
  void remove() {
#if !defined(_WIN32)
    if (owned_) SharedMemory::remove(name_.c_str());
#endif
    owned_ = false;
  }

 private:
  std::string name_;
  bool owned_ = false;
};

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(const CommOptions& options, Store& store, int rank, int size,
                  const std::string& prefix)
      : wire_(options.wire_dtype) {
    check_one_host(store, prefix, rank, size);
    const std::size_t bytes = shm_region_bytes(size);
    try {
      if (rank == 0) {
        name_ = region_name(options, prefix);
#if defined(_WIN32)
        // The creating user's default security: Windows grants it, SYSTEM and administrators.
        bip::permissions owner_only;
#else
        bip::permissions owner_only(0600);
#endif
#if defined(_WIN32)
        memory_ = std::make_unique<SharedMemory>(bip::create_only, name_.c_str(), bip::read_write,
                                                 bytes, owner_only);
#else
        memory_ = std::make_unique<SharedMemory>(bip::create_only, name_.c_str(), bip::read_write,
                                                 owner_only);
        owned_name_.own(name_);
        memory_->truncate(static_cast<bip::offset_t>(bytes));
#endif
        region_ = std::make_unique<bip::mapped_region>(*memory_, bip::read_write, 0, bytes);
        collectives_ =
            std::make_unique<ShmCollectives>(region_->get_address(), rank, size, options.timeout);
        store.set(prefix + "region", bytes_of(name_));
      } else {
        name_ = text_of(store.get(prefix + "region"));
        memory_ = std::make_unique<SharedMemory>(bip::open_only, name_.c_str(), bip::read_write);
        region_ = std::make_unique<bip::mapped_region>(*memory_, bip::read_write, 0, bytes);
        collectives_ =
            std::make_unique<ShmCollectives>(region_->get_address(), rank, size, options.timeout);
      }
    } catch (const bip::interprocess_exception& e) {
      throw CommError("shm: cannot " + std::string(rank == 0 ? "create" : "open") +
                      " the shared region '" + name_ + "' (" + std::to_string(bytes) +
                      " bytes): " + e.what());
    }
    store.set(prefix + "attached/" + std::to_string(rank), bytes_of("1"));
    if (rank == 0) {
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) keys.push_back(prefix + "attached/" + std::to_string(r));
      store.wait(keys, options.timeout);
      owned_name_.remove();
    }
  }

  int rank() const override { return collectives_->rank(); }
  int size() const override { return collectives_->size(); }
  std::string name() const override { return "shm"; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    check_host_buffer(buffer, name());
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_);
  }

  void broadcast(Buffer buffer, int root) override {
    check_host_buffer(buffer, name());
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->broadcast(buffer.data, buffer.bytes(), root);
  }

  void allgather(const Buffer& in, Buffer out) override {
    check_host_buffer(in, name());
    check_host_buffer(out, name());
    check_allgather_buffers(in, out, size());
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->allgather(in.data, out.data, in.bytes());
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->barrier();
  }

 private:
  DType wire_;
  std::string name_;
  RegionName owned_name_;
  // Built in place (no move of Boost's handles: MinGW's GCC warns about their move).
  std::unique_ptr<SharedMemory> memory_;
  std::unique_ptr<bip::mapped_region> region_;
  std::unique_ptr<ShmCollectives> collectives_;
  std::mutex mutex_;  // one collective at a time, as on the other backends
};

}  // namespace

Backend shm_backend() {
  Backend backend;
  backend.name = "shm";
  backend.compiled_in = true;
  // Not in auto's walk over the options: make_communicator() swaps asio-ring for shm once the
  // store shows every rank on one host, which the options alone cannot tell.
  backend.usable = [](const CommOptions&) { return false; };
  backend.make = [](const CommOptions& options, Store& store, int rank, int size,
                    const std::string& prefix) -> std::unique_ptr<Communicator> {
    return std::make_unique<ShmCommunicator>(options, store, rank, size, prefix);
  };
  return backend;
}

}  // namespace partrain::comm
