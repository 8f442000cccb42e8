// BlockArena: the same requests give the same layout (what makes ranks hold the same memory),
// best fit, freed neighbours joined in either order but never across chunks, large blocks
// mapped on their own, and every block aligned and writable.
#include "common/block_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace partrain {
namespace {

constexpr std::size_t kGranule = 4096;
constexpr std::size_t kChunk = 64 * kGranule;

std::ptrdiff_t offset(const void* block, const void* base) {
  return static_cast<const char*>(block) - static_cast<const char*>(base);
}

// Plays a seeded mix of requests and frees; returns each block's offset from the first.
std::vector<std::ptrdiff_t> play(BlockArena& arena) {
  std::mt19937 random(7);
  std::vector<void*> live;
  std::vector<std::ptrdiff_t> offsets;
  void* first = nullptr;
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && random() % 3 == 0) {
      const std::size_t k = random() % live.size();
      arena.free(live[k]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      continue;
    }
    void* block = arena.allocate(1 + random() % (4 * kGranule));
    if (first == nullptr) first = block;
    live.push_back(block);
    offsets.push_back(offset(block, first));
  }
  for (void* block : live) arena.free(block);
  return offsets;
}

TEST(BlockArena, TheSameRequestsGiveTheSameLayout) {
  BlockArena a(kChunk * 16, kGranule), b(kChunk * 16, kGranule);
  const auto in_a = play(a);
  std::vector<void*> noise;  // what happens elsewhere in the process does not move b's blocks
  for (int i = 0; i < 50; ++i) noise.push_back(new char[1000 + i * 37]);
  const auto in_b = play(b);
  for (void* p : noise) delete[] static_cast<char*>(p);
  EXPECT_EQ(in_a, in_b);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.mapped_bytes(), kChunk * 16);
}

TEST(BlockArena, FreedNeighboursJoinInEitherOrder) {
  for (const bool later_first : {false, true}) {
    BlockArena arena(kChunk, kGranule);
    void* x = arena.allocate(2 * kGranule);
    void* y = arena.allocate(3 * kGranule);
    void* z = arena.allocate(kGranule);  // keeps x and y from joining the chunk's free rest
    ASSERT_EQ(offset(y, x), static_cast<std::ptrdiff_t>(2 * kGranule));
    arena.free(later_first ? y : x);
    arena.free(later_first ? x : y);
    EXPECT_EQ(arena.allocate(5 * kGranule), x);
    EXPECT_EQ(arena.mapped_bytes(), kChunk);
    arena.free(z);
  }
}

TEST(BlockArena, TakesTheSmallestFreeBlockThatFits) {
  BlockArena arena(kChunk, kGranule);
  void* three = arena.allocate(3 * kGranule);
  void* keep1 = arena.allocate(kGranule);
  void* two = arena.allocate(2 * kGranule);
  void* keep2 = arena.allocate(kGranule);
  arena.free(three);
  arena.free(two);
  EXPECT_EQ(arena.allocate(2 * kGranule), two);
  EXPECT_EQ(arena.allocate(kGranule + 1), three);  // rounded to two granules
  EXPECT_EQ(arena.used_bytes(), 6 * kGranule);
  arena.free(keep1);
  arena.free(keep2);
}

TEST(BlockArena, LargeBlocksAreMappedAloneAndChunksNeverJoin) {
  BlockArena arena(kChunk, kGranule);
  void* large = arena.allocate(3 * kChunk + 1);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(arena.mapped_bytes(), 3 * kChunk + kGranule);
  std::memset(large, 0x5a, 3 * kChunk + 1);  // all of it is memory to write
  void* x = arena.allocate(kChunk);
  void* y = arena.allocate(kChunk);
  arena.free(x);
  arena.free(y);
  const std::size_t before = arena.mapped_bytes();
  void* both = arena.allocate(2 * kChunk);  // x and y are whole chunks: never one block
  EXPECT_EQ(arena.mapped_bytes(), before + 2 * kChunk);
  EXPECT_NE(both, x);
  EXPECT_NE(both, y);
  arena.free(both);
  arena.free(large);
  EXPECT_EQ(arena.used_bytes(), 0u);
}

TEST(BlockArena, BlocksAreAlignedAndForeignPointersAreIgnored) {
  BlockArena arena(kChunk, kGranule);
  for (std::size_t bytes : {std::size_t{1}, std::size_t{4095}, std::size_t{4097}, kChunk / 3}) {
    void* block = arena.allocate(bytes);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block) % kGranule, 0u) << bytes;
  }
  EXPECT_EQ(arena.allocate(0), nullptr);
  int elsewhere = 0;
  const std::size_t used = arena.used_bytes();
  arena.free(&elsewhere);
  arena.free(nullptr);
  EXPECT_EQ(arena.used_bytes(), used);
}

}  // namespace
}  // namespace partrain
