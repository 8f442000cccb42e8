#include "trainer/device/tensor_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace partrain {
namespace {

std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};

// Each block carries its size in a header in front of the tensor's memory, so that the deleter
// (and raw_deallocate, which gets the pointer alone) knows what to take off the count. 64 bytes
// keep the tensor at the alignment LibTorch's alloc_cpu gives.
constexpr std::size_t kHeader = 64;

void free_counted(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  std::int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof(bytes));
  g_live.fetch_sub(bytes, std::memory_order_relaxed);
  c10::free_cpu(base);
}

void no_delete(void*) {}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) const override {
    if (nbytes == 0) return {nullptr, nullptr, &no_delete, c10::Device(c10::DeviceType::CPU)};
    char* base = static_cast<char*>(c10::alloc_cpu(nbytes + kHeader));
    const auto bytes = static_cast<std::int64_t>(nbytes);
    std::memcpy(base, &bytes, sizeof(bytes));
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
