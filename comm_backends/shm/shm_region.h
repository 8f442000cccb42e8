// defines: ShmRegion, shm_region_text() — one shared-memory region (Boost.Interprocess) that the
// ranks of one host map, set up through the store, and that leaves no name behind however the run
// ends.
//
// Rank 0 of the group creates the region, owner-only, under a name made of the run token,
// the store prefix and random bits, prepares it, and publishes the name; the others map it
// and say so; then rank 0 removes the name (POSIX), so the region lives exactly as long as
// the ranks' mappings. On Windows the kernel removes a mapping with its last handle.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace partrain::comm {

class Store;

// "the shared region of N MiB", N rounded up: how both the choice of a backend (a region that
// would not fit) and a region's setup (one that did not) name it.
std::string shm_region_text(std::size_t bytes);

class ShmRegion {
 public:
  // `rank` and `size` count the ranks that share the region (0 creates it). `prepare` runs on
  // every rank once the region is mapped; on rank 0 before any other rank can see it (to lay
  // out what the others expect to find). Returns once every rank has the region mapped;
  // throws CommError when the region cannot be made or opened, or a rank does not attach
  // within `timeout`.
  ShmRegion(Store& store, const std::string& prefix, const std::string& token, int rank, int size,
            std::size_t bytes, std::chrono::milliseconds timeout,
            const std::function<void(void* address)>& prepare);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  void* address() const;
  std::size_t bytes() const { return bytes_; }

 private:
  struct Handles;
  std::size_t bytes_;
  std::unique_ptr<Handles> handles_;
};

}  // namespace partrain::comm
