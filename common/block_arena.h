// defines: BlockArena — large memory blocks placed by this code alone: best fit among the free
// blocks, freed neighbours joined again, more memory mapped from the system in chunks when none
// fits, nothing returned before the process ends.
//
// Why training's large tensors come from here and not from malloc: a step allocates and frees
// the same large blocks in the same order on every rank, but a general malloc places them among
// its small allocations too (the communication thread's, the store's, the report's), which
// differ from rank to rank in number and timing. The large blocks then land at other offsets,
// freed memory splits differently, and ranks of one run keep different amounts resident (with
// tcmalloc up to 62 MiB apart: bench/ddp/shard.sh, BENCHMARKS.md). Placed here, by the
// sequence of large requests only, the same sequence gives the same layout and the same
// resident memory on every rank; and the blocks are kept for reuse, so a step does not fault
// its pages in again (what unmapping each free would cost).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace partrain {

class BlockArena {
 public:
  // Blocks are multiples of `granule` bytes at `granule`-aligned addresses (a power of two of
  // at least 64); the system is asked for `chunk` bytes at a time, or a whole larger block.
  explicit BlockArena(std::size_t chunk = std::size_t{256} << 20,
                      std::size_t granule = std::size_t{4} << 10);
  ~BlockArena();  // unmaps every chunk: only when no block is in use any more
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;

  // A block of at least `bytes` (> 0), or nullptr when the system gives no more memory.
  void* allocate(std::size_t bytes);
  // Gives back a block allocate() returned; nullptr does nothing.
  void free(void* block);

  std::size_t mapped_bytes() const;  // taken from the system so far
  std::size_t used_bytes() const;    // in blocks now in use (rounded to the granule)

 private:
  struct Free {
    std::size_t bytes;
    char* chunk_end;  // neighbours join only within one chunk
  };
  void add_free(char* at, std::size_t bytes, char* chunk_end);

  const std::size_t chunk_;
  const std::size_t granule_;
  mutable std::mutex mutex_;
  std::map<char*, Free> free_by_address_;
  std::set<std::pair<std::size_t, char*>> free_by_size_;  // best fit, the lower address first
  std::unordered_map<char*, std::pair<std::size_t, char*>> used_;  // block -> bytes, chunk end
  std::vector<std::pair<char*, std::size_t>> chunks_;
  std::size_t mapped_ = 0;
  std::size_t used_bytes_ = 0;
};

}  // namespace partrain
