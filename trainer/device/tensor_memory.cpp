#include "trainer/device/tensor_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "common/block_arena.h"

namespace partrain {
namespace {

std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};

// Each block carries its size and origin in a header in front of the tensor's memory, so that
// the deleter (and raw_deallocate, which gets the pointer alone) knows what to take off the
// count and where to give the block back. 64 bytes keep the tensor at the alignment LibTorch's
// alloc_cpu gives.
constexpr std::size_t kHeader = 64;
enum class Origin : std::int64_t { libtorch = 0, arena = 1 };

// Blocks from this size up (activations, gradients, buckets, optimizer state) are placed by a
// BlockArena, so that ranks making the same large requests in the same order hold the same
// memory whatever their small allocations were (common/block_arena.h says why). Never
// destroyed: tensors may be freed at any point of the process's exit.
// Under AddressSanitizer every block stays LibTorch's, where the sanitizer sees past its end.
#if defined(__SANITIZE_ADDRESS__)
#define PARTRAIN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PARTRAIN_ASAN 1
#endif
#endif
#if defined(PARTRAIN_ASAN)
constexpr std::size_t kArenaFrom = SIZE_MAX;
#else
constexpr std::size_t kArenaFrom = std::size_t{1} << 20;
#endif
BlockArena& arena() {
  static auto* a = new BlockArena();
  return *a;
}

void free_counted(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  std::int64_t header[2] = {};
  std::memcpy(header, base, sizeof(header));
  g_live.fetch_sub(header[0], std::memory_order_relaxed);
  if (header[1] == static_cast<std::int64_t>(Origin::arena)) {
    arena().free(base);
  } else {
    c10::free_cpu(base);
  }
}

void no_delete(void*) {}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) const override {
    if (nbytes == 0) return {nullptr, nullptr, &no_delete, c10::Device(c10::DeviceType::CPU)};
    Origin origin = Origin::arena;
    char* base = nbytes >= kArenaFrom - kHeader
                     ? static_cast<char*>(arena().allocate(nbytes + kHeader))
                     : nullptr;
    if (base == nullptr) {  // small, or the system gave the arena no more: LibTorch's own
      origin = Origin::libtorch;
      base = static_cast<char*>(c10::alloc_cpu(nbytes + kHeader));
    }
    const auto bytes = static_cast<std::int64_t>(nbytes);
    const std::int64_t header[2] = {bytes, static_cast<std::int64_t>(origin)};
    std::memcpy(base, header, sizeof(header));
    const std::int64_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    void* data = base + kHeader;
    return {data, data, &free_counted, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }
};

CountingCpuAllocator g_allocator;

}  // namespace

void count_cpu_tensor_memory() {
  static std::once_flag once;
  // Priority 1: above LibTorch's default CPU allocator, which registers at 0.
  std::call_once(once, [] { c10::SetCPUAllocator(&g_allocator, 1); });
}

std::int64_t cpu_tensor_bytes() { return g_live.load(std::memory_order_relaxed); }
std::int64_t cpu_tensor_peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_cpu_tensor_peak() { g_peak.store(g_live.load(std::memory_order_relaxed)); }

}  // namespace partrain
