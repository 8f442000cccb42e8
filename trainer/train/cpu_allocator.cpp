#include "trainer/train/cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#ifdef _WIN32
#include <windows.h>
#else
#include <sys/mman.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm_backends/errors.h"

namespace partrain {
namespace {

constexpr std::size_t kPageBytes = 4096;
// Above LibTorch's default CPU allocator (priority 0), so that ours replaces it.
constexpr uint8_t kInstallPriority = 1;

std::size_t round_to_pages(std::size_t bytes) {
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

void* map_pages(std::size_t bytes) {
#ifdef _WIN32
  return VirtualAlloc(nullptr, bytes, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE);
#else
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
#endif
}

void unmap_pages(void* p, std::size_t bytes) {
#ifdef _WIN32
  (void)bytes;
  VirtualFree(p, 0, MEM_RELEASE);
#else
  munmap(p, bytes);
#endif
}

struct Block {
  void* ptr;
  std::size_t bytes;
};

struct LiveBlock {
  CachingCpuAllocator::State* owner;  // nullptr once its allocator is gone
  std::size_t bytes;
};

// The process-wide table of live large blocks and the mutex that also guards every cache.
// Leaked on purpose: tensors freed during static destruction still find it.
struct Registry {
  std::mutex mutex;
  std::unordered_map<void*, LiveBlock> live;
};
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

}  // namespace

// The cache of one allocator. Free blocks sit in `lru` (least recently freed first) and are
// indexed by size in `by_size`, whose deques are in the same order: reuse takes a deque's
// back (warmest pages), eviction the list's front, which is also the front of its deque.
// All members are guarded by registry().mutex.
struct CachingCpuAllocator::State {
  std::list<Block> lru;
  std::map<std::size_t, std::deque<std::list<Block>::iterator>> by_size;
  CachingCpuAllocatorOptions options;
  CpuAllocatorStats stats;

  // The most recently freed block of the smallest cached size that holds `bytes` and wastes
  // at most `max_slack(bytes)`; {nullptr, 0} when there is none.
  Block take(std::size_t bytes) {
    auto found = by_size.lower_bound(bytes);
    if (found == by_size.end() || found->first - bytes > max_slack(bytes)) return {nullptr, 0};
    auto it = found->second.back();
    found->second.pop_back();
    if (found->second.empty()) by_size.erase(found);
    const Block block = *it;
    lru.erase(it);
    stats.cached_bytes -= block.bytes;
    return block;
  }

  std::size_t max_slack(std::size_t bytes) const {
    return static_cast<std::size_t>(static_cast<double>(bytes) * options.max_waste);
  }

  // Caches a freed block; appends to `to_unmap` what no longer fits under the limit.
  void put(void* ptr, std::size_t bytes, std::vector<Block>& to_unmap) {
    lru.push_back(Block{ptr, bytes});
    by_size[bytes].push_back(std::prev(lru.end()));
    stats.cached_bytes += bytes;
    const std::size_t limit =
        std::min(options.max_cached_bytes,
                 static_cast<std::size_t>(options.cache_vs_peak *
                                          static_cast<double>(stats.peak_live_bytes)));
    while (stats.cached_bytes > limit && !lru.empty()) evict_oldest(to_unmap);
  }

  void evict_oldest(std::vector<Block>& to_unmap) {
    Block oldest = lru.front();
    auto queue = by_size.find(oldest.bytes);
    queue->second.pop_front();
    if (queue->second.empty()) by_size.erase(queue);
    lru.pop_front();
    stats.cached_bytes -= oldest.bytes;
    stats.mapped_bytes -= oldest.bytes;
    ++stats.evictions;
    to_unmap.push_back(oldest);
  }

  void note_live(std::size_t bytes) {
    stats.live_bytes += bytes;
    stats.peak_live_bytes = std::max(stats.peak_live_bytes, stats.live_bytes);
  }
};

namespace {

// The one deleter of every DataPtr this allocator returns (see the header).
void release_block(void* ptr) {
  if (ptr == nullptr) return;
  Registry& reg = registry();
  std::vector<Block> to_unmap;
  bool ours = false;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto found = reg.live.find(ptr);
    if (found != reg.live.end()) {
      ours = true;
      const LiveBlock block = found->second;
      reg.live.erase(found);
      // Reported while still locked: once cached, another thread may be given this address.
      c10::profiledCPUMemoryReporter().Delete(ptr);
      if (block.owner != nullptr) {
        block.owner->stats.live_bytes -= block.bytes;
        block.owner->put(ptr, block.bytes, to_unmap);
      } else {
        to_unmap.push_back(Block{ptr, block.bytes});
      }
    }
  }
  for (const Block& b : to_unmap) unmap_pages(b.ptr, b.bytes);
  if (!ours) c10::GetDefaultCPUAllocator()->raw_deleter()(ptr);
}

std::mutex& install_mutex() {
  static std::mutex m;
  return m;
}
CachingCpuAllocator* g_installed = nullptr;  // guarded by install_mutex()

}  // namespace

CachingCpuAllocator::CachingCpuAllocator(CachingCpuAllocatorOptions options)
    : options_(options), state_(std::make_unique<State>()) {
  PARTRAIN_CHECK(c10::GetDefaultCPUAllocator()->raw_deleter() != nullptr, Error,
                 "LibTorch's default CPU allocator has no raw deleter; the caching allocator "
                 "needs one for the blocks it does not cache");
  PARTRAIN_CHECK(options_.max_waste >= 0 && options_.cache_vs_peak >= 0, Error,
                 "CachingCpuAllocatorOptions: max_waste and cache_vs_peak must be >= 0");
  state_->options = options_;
}

CachingCpuAllocator::~CachingCpuAllocator() {
  Registry& reg = registry();
  std::list<Block> cached;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (auto& [ptr, block] : reg.live) {
      if (block.owner == state_.get()) block.owner = nullptr;
    }
    cached.swap(state_->lru);
    state_->by_size.clear();
  }
  for (const Block& b : cached) unmap_pages(b.ptr, b.bytes);
}

c10::DataPtr CachingCpuAllocator::allocate(std::size_t bytes) const {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (bytes < options_.min_cached_bytes) {
    void* ptr = c10::GetDefaultCPUAllocator()->raw_allocate(bytes);
    return c10::DataPtr(ptr, ptr, &release_block, cpu);
  }
  const std::size_t block_bytes = round_to_pages(bytes);
  Registry& reg = registry();
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    const Block cached = state_->take(block_bytes);
    ptr = cached.ptr;
    if (ptr != nullptr) {
      ++state_->stats.hits;
      state_->note_live(cached.bytes);
      reg.live.emplace(ptr, LiveBlock{state_.get(), cached.bytes});
    }
  }
  if (ptr == nullptr) {
    // Mapped outside the lock: the system call may fault in page tables and take a while.
    ptr = map_pages(block_bytes);
    TORCH_CHECK(ptr != nullptr,
                "partrain CPU allocator: not enough memory: you tried to "
                "allocate ",
                bytes, " bytes");
    std::lock_guard<std::mutex> lock(reg.mutex);
    ++state_->stats.misses;
    state_->stats.mapped_bytes += block_bytes;
    state_->note_live(block_bytes);
    reg.live.emplace(ptr, LiveBlock{state_.get(), block_bytes});
  }
  c10::profiledCPUMemoryReporter().New(ptr, bytes);
  return c10::DataPtr(ptr, ptr, &release_block, cpu);
}

c10::DataPtr CachingCpuAllocator::allocate(std::size_t bytes) {
  return std::as_const(*this).allocate(bytes);
}

c10::DeleterFnPtr CachingCpuAllocator::raw_deleter() const { return &release_block; }

void CachingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count > 0) std::memcpy(dest, src, count);
}

CpuAllocatorStats CachingCpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return state_->stats;
}

void CachingCpuAllocator::release_cached() const {
  std::list<Block> cached;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    cached.swap(state_->lru);
    state_->by_size.clear();
    for (const Block& b : cached) {
      state_->stats.cached_bytes -= b.bytes;
      state_->stats.mapped_bytes -= b.bytes;
    }
  }
  for (const Block& b : cached) unmap_pages(b.ptr, b.bytes);
}

std::string install_cpu_allocator() {
  const char* env = std::getenv("PARTRAIN_CPU_ALLOCATOR");
  const std::string choice = env == nullptr ? "" : env;
  PARTRAIN_CHECK(choice.empty() || choice == "caching" || choice == "system", UsageError,
                 "environment variable PARTRAIN_CPU_ALLOCATOR=", choice,
                 ": expected caching or system");
  std::lock_guard<std::mutex> lock(install_mutex());
  c10::Allocator* current = c10::GetCPUAllocator();
  c10::Allocator* standard = c10::GetDefaultCPUAllocator();
  if (current != standard && current != g_installed) return "system";  // someone else's
  if (choice == "system") {
    if (current != standard) c10::SetCPUAllocator(standard, kInstallPriority);
    return "system";
  }
  if (g_installed == nullptr) g_installed = new CachingCpuAllocator();  // lives forever
  c10::SetCPUAllocator(g_installed, kInstallPriority);
  return c10::GetCPUAllocator() == g_installed ? "caching" : "system";
}

CachingCpuAllocator* installed_cpu_allocator() {
  std::lock_guard<std::mutex> lock(install_mutex());
  return g_installed;
}

}  // namespace partrain
