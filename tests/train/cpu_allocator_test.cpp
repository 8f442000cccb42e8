// The caching CPU allocator: reuse, size fitting, the cache limit, the deleter's handling of
// foreign pointers, thread safety, and installation as LibTorch's CPU allocator.
#include "trainer/train/cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm_backends/errors.h"

namespace partrain {
namespace {

constexpr std::size_t kKiB = 1024;

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

TEST(CachingCpuAllocator, ReusesFreedBlockOfSameSize) {
  CachingCpuAllocator alloc;
  void* first = nullptr;
  {
    c10::DataPtr a = alloc.allocate(100 * kKiB);
    first = a.get();
    ASSERT_NE(first, nullptr);
    EXPECT_TRUE(aligned64(first));
    std::memset(first, 0x5a, 100 * kKiB);             // the whole request is writable
    EXPECT_EQ(alloc.stats().live_bytes, 100 * kKiB);  // 100 KiB is 25 whole pages
  }
  EXPECT_EQ(alloc.stats().live_bytes, 0u);
  EXPECT_EQ(alloc.stats().cached_bytes, 100 * kKiB);
  c10::DataPtr b = alloc.allocate(100 * kKiB - 100);  // rounds to the same 25 pages
  EXPECT_EQ(b.get(), first);
  const CpuAllocatorStats s = alloc.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.mapped_bytes, 100 * kKiB);
}

TEST(CachingCpuAllocator, FitsIntoLargerBlockOnlyWithinMaxWaste) {
  CachingCpuAllocatorOptions o;
  o.max_waste = 0.5;
  CachingCpuAllocator alloc(o);
  void* big = nullptr;
  { big = alloc.allocate(400 * kKiB).get(); }
  {
    c10::DataPtr too_small = alloc.allocate(200 * kKiB);  // 400 > 1.5 x 200: fresh pages
    EXPECT_NE(too_small.get(), big);
  }
  c10::DataPtr fits = alloc.allocate(300 * kKiB);  // 400 <= 1.5 x 300: reuses the block
  EXPECT_EQ(fits.get(), big);
  EXPECT_EQ(alloc.stats().live_bytes, 400 * kKiB);  // live counts the whole block

  CachingCpuAllocatorOptions exact;
  exact.max_waste = 0;
  CachingCpuAllocator strict(exact);
  void* p = nullptr;
  { p = strict.allocate(128 * kKiB).get(); }
  c10::DataPtr q = strict.allocate(124 * kKiB);
  EXPECT_NE(q.get(), p);
  EXPECT_EQ(strict.stats().hits, 0u);
}

TEST(CachingCpuAllocator, CacheStaysWithinLimitAndEvictsLeastRecentlyFreed) {
  CachingCpuAllocatorOptions o;
  o.max_cached_bytes = 2 * 256 * kKiB;
  o.max_waste = 0;
  CachingCpuAllocator alloc(o);
  std::vector<c10::DataPtr> blocks;
  std::vector<void*> addresses;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(alloc.allocate(256 * kKiB));
    addresses.push_back(blocks.back().get());
  }
  blocks.clear();  // frees in order 0, 1, 2, 3: 0 and 1 are the oldest and go
  CpuAllocatorStats s = alloc.stats();
  EXPECT_EQ(s.cached_bytes, 2 * 256 * kKiB);
  EXPECT_EQ(s.mapped_bytes, 2 * 256 * kKiB);
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.peak_live_bytes, 4 * 256 * kKiB);
  c10::DataPtr again = alloc.allocate(256 * kKiB);
  EXPECT_EQ(again.get(), addresses[3]);  // most recently freed first
  c10::DataPtr next = alloc.allocate(256 * kKiB);
  EXPECT_EQ(next.get(), addresses[2]);
}

TEST(CachingCpuAllocator, CacheFollowsPeakOfLiveBytes) {
  CachingCpuAllocatorOptions o;
  o.cache_vs_peak = 1.0;
  o.max_waste = 0;
  CachingCpuAllocator alloc(o);
  { c10::DataPtr one = alloc.allocate(512 * kKiB); }  // peak 512 KiB
  for (std::size_t kib : {64, 128, 192, 256}) {       // sizes that never recur
    c10::DataPtr p = alloc.allocate(kib * kKiB);
  }
  const CpuAllocatorStats s = alloc.stats();
  EXPECT_EQ(s.peak_live_bytes, 512 * kKiB);
  EXPECT_LE(s.cached_bytes, 512 * kKiB);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.mapped_bytes, s.cached_bytes);
}

TEST(CachingCpuAllocator, SmallRequestsGoToDefaultAllocator) {
  CachingCpuAllocator alloc;
  c10::DataPtr small = alloc.allocate(1000);
  ASSERT_NE(small.get(), nullptr);
  EXPECT_TRUE(aligned64(small.get()));
  EXPECT_EQ(small.get(), small.get_context());
  EXPECT_EQ(small.get_deleter(), alloc.raw_deleter());
  EXPECT_EQ(alloc.stats().live_bytes, 0u);
  EXPECT_EQ(alloc.stats().misses, 0u);
  c10::DataPtr empty = alloc.allocate(0);
  EXPECT_EQ(empty.get(), nullptr);
}

TEST(CachingCpuAllocator, RawInterfaceAndForeignPointers) {
  CachingCpuAllocator alloc;
  void* large = alloc.raw_allocate(300 * kKiB);
  void* small = alloc.raw_allocate(100);
  EXPECT_EQ(alloc.stats().live_bytes, 300 * kKiB);
  alloc.raw_deallocate(large);
  alloc.raw_deallocate(small);
  EXPECT_EQ(alloc.stats().live_bytes, 0u);
  EXPECT_EQ(alloc.stats().cached_bytes, 300 * kKiB);
  // A block the default allocator handed out (before installation, say) comes back through
  // this allocator's deleter: it must reach the default's deleter, not the cache.
  void* foreign = c10::GetDefaultCPUAllocator()->raw_allocate(1 << 20);
  alloc.raw_deallocate(foreign);
  EXPECT_EQ(alloc.stats().cached_bytes, 300 * kKiB);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().cached_bytes, 0u);
  EXPECT_EQ(alloc.stats().mapped_bytes, 0u);
}

TEST(CachingCpuAllocator, BlocksOutliveTheirAllocator) {
  c10::DataPtr survivor;
  {
    CachingCpuAllocator alloc;
    survivor = alloc.allocate(200 * kKiB);
    std::memset(survivor.get(), 1, 200 * kKiB);
  }
  EXPECT_EQ(static_cast<unsigned char*>(survivor.get())[200 * kKiB - 1], 1);
  survivor.clear();  // unmapped now, without an allocator to cache it
  CachingCpuAllocator fresh;
  EXPECT_EQ(fresh.stats().cached_bytes, 0u);
}

TEST(CachingCpuAllocator, ThreadsAllocateAndFreeConcurrently) {
  CachingCpuAllocator alloc;
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::size_t sizes[] = {64 * kKiB, 96 * kKiB, 200 * kKiB, 1000, 512 * kKiB};
      for (int i = 0; i < 300; ++i) {
        std::vector<c10::DataPtr> held;
        for (std::size_t k = 0; k < 3; ++k) {
          const std::size_t n = sizes[(i + k + t) % 5];
          held.push_back(alloc.allocate(n));
          std::memset(held.back().get(), t + 1, n);
        }
        for (std::size_t k = 0; k < 3; ++k) {
          const std::size_t n = sizes[(i + k + t) % 5];
          auto* bytes = static_cast<unsigned char*>(held[k].get());
          if (bytes[0] != t + 1 || bytes[n - 1] != t + 1) ++wrong[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t;
  const CpuAllocatorStats s = alloc.stats();
  EXPECT_EQ(s.live_bytes, 0u);
  EXPECT_EQ(s.mapped_bytes, s.cached_bytes);
  EXPECT_LE(s.cached_bytes, 2 * s.peak_live_bytes);
  EXPECT_GT(s.hits, s.misses);
}

TEST(InstallCpuAllocator, ServesTensorsAndSwitchesBackOnRequest) {
  ::unsetenv("PARTRAIN_CPU_ALLOCATOR");
  ASSERT_EQ(install_cpu_allocator(), "caching");
  CachingCpuAllocator* installed = installed_cpu_allocator();
  ASSERT_NE(installed, nullptr);
  EXPECT_EQ(c10::GetCPUAllocator(), installed);
  const std::size_t before = installed->stats().live_bytes;
  torch::Tensor t = torch::full({1 << 18}, 2.5f);  // 1 MiB
  EXPECT_TRUE(aligned64(t.data_ptr()));
  EXPECT_EQ(installed->stats().live_bytes, before + (std::size_t{1} << 20));
  EXPECT_FLOAT_EQ((t * 2).sum().item<float>(), 5.0f * (1 << 18));

  ::setenv("PARTRAIN_CPU_ALLOCATOR", "system", 1);
  EXPECT_EQ(install_cpu_allocator(), "system");
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  t = torch::Tensor();  // allocated by the cache: goes back there after the switch
  EXPECT_EQ(installed->stats().live_bytes, before);

  ::setenv("PARTRAIN_CPU_ALLOCATOR", "fast", 1);
  EXPECT_THROW(install_cpu_allocator(), UsageError);
  ::unsetenv("PARTRAIN_CPU_ALLOCATOR");
}

}  // namespace
}  // namespace partrain
