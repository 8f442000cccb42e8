// defines: CachingCpuAllocator (LibTorch CPU allocator that keeps large blocks for reuse),
//          CachingCpuAllocatorOptions, CpuAllocatorStats, install_cpu_allocator,
//          installed_cpu_allocator
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <memory>
#include <string>

namespace partrain {

// Why: every training step asks for the same tensor sizes (activations, gradients, batches).
// glibc serves the large ones from its heap once its dynamic mmap threshold has grown, and
// keeps what they free there as slack; with a fixed low threshold every tensor is a fresh
// mmap instead, page faults and zeroing on every step (~35 % fewer images/s). This allocator
// keeps large blocks mapped and hands them out again:
//
//   request >= min_cached_bytes: round up to whole 4 KiB pages; take the most recently freed
//     cached block of the smallest cached size that holds it and is at most (1 + max_waste)
//     times its size. None? Map fresh pages.
//   freed large block: back into the cache under its size; then, while the cached-but-free
//     bytes exceed the limit, unmap the least recently freed blocks.
//   request < min_cached_bytes: LibTorch's default CPU allocator, unchanged.
//
// limit = min(max_cached_bytes, cache_vs_peak x the peak of live large bytes so far): the
// cache follows the largest working set it has served, so steady-state steps neither map nor
// fault pages, and what it holds stays bounded by a multiple of that peak.
//
// Why not exact sizes only: a step's sizes recur, but each size peaks at its own moment
// (forward activations, then gradients of other shapes; the last, smaller batch of an epoch;
// evaluation). Caching per exact size then holds the sum of the per-size peaks, about 3x the
// peak of live bytes (DigitalNet-16, batch 128: 147 MiB against 47); reusing a somewhat
// larger block brings that to about 1.6x with the same hit rate (99 %). Pages of a block
// that a smaller tensor reuses are resident already, so that costs no extra memory.
//
// Every DataPtr it returns has data == context and one deleter (raw_deleter() works, as
// oneDNN's engine allocator requires). The deleter recognises this allocator's large blocks
// by a process-wide table; any other pointer is handed to the default allocator's deleter:
// the pointers LibTorch's default allocator gave out before installation (oneDNN frees its
// scratch memory through whichever CPU allocator is current) are freed correctly.
// Thread-safe: one mutex guards the table and the caches (loader threads allocate too).
// Blocks are page aligned (LibTorch expects 64 bytes).
struct CachingCpuAllocatorOptions {
  std::size_t min_cached_bytes = std::size_t{64} << 10;  // smaller: default allocator
  std::size_t max_cached_bytes = std::size_t{4} << 30;   // hard cap on cached-but-free bytes
  double max_waste = 1.0;      // reuse blocks up to (1 + max_waste) x the request; 0: exact
  double cache_vs_peak = 2.0;  // cached-but-free bytes <= this x peak of live large bytes
};

struct CpuAllocatorStats {
  std::size_t live_bytes = 0;       // large blocks handed out and not yet freed
  std::size_t peak_live_bytes = 0;  // high-water mark of live_bytes
  std::size_t cached_bytes = 0;     // large blocks freed and kept for reuse
  std::size_t mapped_bytes = 0;     // live + cached: what the system holds for this allocator
  std::size_t hits = 0;             // large requests served from the cache
  std::size_t misses = 0;           // large requests that mapped fresh pages
  std::size_t evictions = 0;        // freed blocks returned to the system (limit reached)
};

// Not copyable; an instance must outlive the tensors it allocated unless destroyed first, in
// which case their blocks are unmapped when freed. The installed instance lives forever.
//
// Neither `allocate` carries `override`: LibTorch 1.x declares it const, LibTorch >= 2.3
// non-const, and exactly one of the two overrides in each; `copy_data` is pure virtual in 2.x
// and absent in 1.x. The other members leave out `override` too, so that compilers that warn
// about inconsistent use stay quiet.
class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(CachingCpuAllocatorOptions options = {});
  ~CachingCpuAllocator();
  CachingCpuAllocator(const CachingCpuAllocator&) = delete;
  CachingCpuAllocator& operator=(const CachingCpuAllocator&) = delete;

  c10::DataPtr allocate(std::size_t bytes) const;
  c10::DataPtr allocate(std::size_t bytes);
  c10::DeleterFnPtr raw_deleter() const;
  void copy_data(void* dest, const void* src, std::size_t count) const;

  CpuAllocatorStats stats() const;
  // Returns every cached block to the system (live blocks are untouched).
  void release_cached() const;

  struct State;  // the cache; defined in the .cpp

 private:
  CachingCpuAllocatorOptions options_;
  std::unique_ptr<State> state_;
};

// Makes LibTorch's CPU tensors use the process-wide CachingCpuAllocator, or LibTorch's default
// allocator when the environment says PARTRAIN_CPU_ALLOCATOR=system (to compare the two;
// "caching" or unset selects the cache). Tensors already allocated keep their own deleters, so
// switching at any time is safe. Leaves an allocator that someone else installed alone.
// Returns the name of the allocator in force: "caching" or "system". Throws UsageError for
// any other value of the variable.
std::string install_cpu_allocator();

// The process-wide instance if it has been created (by install_cpu_allocator), else nullptr.
CachingCpuAllocator* installed_cpu_allocator();

}  // namespace partrain
