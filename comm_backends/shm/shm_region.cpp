#include "comm_backends/shm/shm_region.h"

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/permissions.hpp>
#if defined(_WIN32)
#include <boost/interprocess/windows_shared_memory.hpp>
#else
#include <boost/interprocess/shared_memory_object.hpp>
#endif

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#endif

#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string_view>
#include <vector>

#include "comm_backends/store/store.h"
#include "common/abrupt_exit.h"
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

std::string region_name(const std::string& token, const std::string& prefix) {
  std::random_device random;
  std::ostringstream name;
  name << "partrain-shm-" << std::hex << fnv1a_64(token) << "-" << fnv1a_64(prefix) << "-"
       << random() << random();
  return name.str();
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
#if defined(__linux__)
    // Where POSIX shared memory lives on Linux: a stop that ends this rank at once in its
    // start-up, while the others attach, removes it there.
    at_abrupt_exit_ = std::make_unique<RemovedAtAbruptExit>("/dev/shm/" + name_);
#endif
  }
  void remove() {
#if !defined(_WIN32)
    if (owned_) SharedMemory::remove(name_.c_str());
#endif
    owned_ = false;
    at_abrupt_exit_.reset();
  }

 private:
  std::string name_;
  bool owned_ = false;
  std::unique_ptr<RemovedAtAbruptExit> at_abrupt_exit_;
};

#if defined(__linux__)
// A region of `bytes` that does not fit where the system keeps shared memory.
CommError does_not_fit(std::size_t bytes) {
  return CommError("shm: " + shm_region_text(bytes) +
                   " does not fit in /dev/shm: give /dev/shm more room (docker run "
                   "--shm-size) or set comm.backend to asio-ring");
}

// Takes the region's pages from /dev/shm on rank 0, before any rank maps them, so that a region
// that does not fit fails here with a message on every kernel, not as a SIGBUS in the middle of
// a collective (populate(), below, finds it too, but only from Linux 5.14). A file system or
// sandbox that cannot reserve (EOPNOTSUPP, ENOSYS) leaves it to populate(). The call may be cut
// short by a signal; it is tried again a few times, then the signal's error stands.
void reserve(int fd, std::size_t bytes) {
  constexpr int kTries = 4;
  int error = 0;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0) return;
    error = errno;
    if (error != EINTR) break;
  }
  if (error == EOPNOTSUPP || error == ENOSYS) return;  // no fallocate here (a sandbox, say)
  if (error == ENOSPC) throw does_not_fit(bytes);
  throw CommError("shm: cannot reserve the shared region of " + std::to_string(bytes) +
                  " bytes in /dev/shm (" + std::strerror(error) + ")");
}
#endif

// Maps every page of the region into this process now, so that no collective pays for a page
// fault: broadcasts of 16 KiB at W=2 going round the stream for the first time took 9.2-9.8 us
// (median of 200), 2.6-2.9 with the pages mapped beforehand (BENCHMARKS.md, "The broadcast as
// a stream"). The content stays as it is (rank 0 lays it out before the others map it). Where
// reserve() could not take the pages beforehand, a region that does not fit fails here too.
// Kernels before 5.14 and Windows map the pages as they are first touched.
void populate(void* address, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  if (::madvise(address, bytes, MADV_POPULATE_WRITE) == 0 || errno == EINVAL) return;
  const int error = errno;
  // EFAULT: a page would have raised SIGBUS, which is how a full tmpfs answers.
  if (error == EFAULT) throw does_not_fit(bytes);
  throw CommError("shm: cannot map the shared region of " + std::to_string(bytes) + " bytes (" +
                  std::strerror(error) + ")");
#else
  (void)address;
  (void)bytes;
#endif
}

// The bytes of a region as the system holds it; -1 where it does not say.
bip::offset_t size_of(const SharedMemory& memory) {
#if defined(_WIN32)
  const bip::offset_t size = memory.get_size();
  return size > 0 ? size : -1;
#else
  bip::offset_t size = 0;
  return memory.get_size(size) ? size : -1;
#endif
}

// What rank 0 publishes in place of the region's name when it cannot make the region, before
// why (a name never starts so).
constexpr std::string_view kNoRegion = "!";

}  // namespace

std::string shm_region_text(std::size_t bytes) {
  return "the shared region of " + std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

struct ShmRegion::Handles {
  RegionName owned_name;
  // Built in place (no move of Boost's handles: MinGW's GCC warns about their move).
  std::unique_ptr<SharedMemory> memory;
  std::unique_ptr<bip::mapped_region> region;
};

ShmRegion::ShmRegion(Store& store, const std::string& prefix, const std::string& token, int rank,
                     int size, std::size_t bytes, std::chrono::milliseconds timeout,
                     const std::function<void(void* address)>& prepare)
    : bytes_(bytes), handles_(std::make_unique<Handles>()) {
  std::string name;
  try {
    try {
      if (rank == 0) {
        name = region_name(token, prefix);
#if defined(_WIN32)
        // The creating user's default security: Windows grants it, SYSTEM and administrators.
        bip::permissions owner_only;
        handles_->memory = std::make_unique<SharedMemory>(bip::create_only, name.c_str(),
                                                          bip::read_write, bytes, owner_only);
#else
        bip::permissions owner_only(0600);
        handles_->memory = std::make_unique<SharedMemory>(bip::create_only, name.c_str(),
                                                          bip::read_write, owner_only);
        handles_->owned_name.own(name);
        handles_->memory->truncate(static_cast<bip::offset_t>(bytes));
#if defined(__linux__)
        reserve(handles_->memory->get_mapping_handle().handle, bytes);
#endif
#endif
      } else {
        const auto published = store.get(prefix + "region");
        name.assign(published.begin(), published.end());
        PARTRAIN_CHECK(
            name.rfind(kNoRegion, 0) != 0, CommError,
            "shm: rank 0 could not make the shared region: ", name.substr(kNoRegion.size()));
        handles_->memory =
            std::make_unique<SharedMemory>(bip::open_only, name.c_str(), bip::read_write);
        // Before mapping: a rank of another build may lay the region out otherwise, and mapping
        // more than rank 0 made would fault past its end. (A system may round a region up to
        // its pages; a layout that differs at the same size the region's magic tells.)
        const bip::offset_t made = size_of(*handles_->memory);
        PARTRAIN_CHECK(made < 0 || made >= static_cast<bip::offset_t>(bytes), CommError,
                       "shm: rank 0 made a shared region of ", made, " bytes, and this rank's ",
                       "build lays out ", bytes, ": run the same build on every rank");
      }
      handles_->region =
          std::make_unique<bip::mapped_region>(*handles_->memory, bip::read_write, 0, bytes);
      populate(handles_->region->get_address(), bytes);
      prepare(handles_->region->get_address());
    } catch (const std::exception& e) {
      // The others wait for the region's name: rank 0 gives them why there is none instead, so
      // that they fail at once rather than when their wait runs out.
      if (rank == 0) {
        const std::string why = std::string(kNoRegion) + e.what();
        try {
          store.set(prefix + "region", std::vector<std::uint8_t>(why.begin(), why.end()));
        } catch (const std::exception&) {  // the store is gone too: the others' wait ends it
        }
      }
      throw;
    }
    if (rank == 0) {
      store.set(prefix + "region", std::vector<std::uint8_t>(name.begin(), name.end()));
    }
  } catch (const bip::interprocess_exception& e) {
    throw CommError("shm: cannot " + std::string(rank == 0 ? "create" : "open") +
                    " the shared region '" + name + "' (" + std::to_string(bytes) +
                    " bytes): " + e.what());
  }
  store.set(prefix + "attached/" + std::to_string(rank), {'1'});
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(prefix + "attached/" + std::to_string(r));
    store.wait(keys, timeout);
    handles_->owned_name.remove();
  }
}

ShmRegion::~ShmRegion() = default;

void* ShmRegion::address() const { return handles_->region->get_address(); }

}  // namespace partrain::comm
