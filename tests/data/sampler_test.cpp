#include "trainer/data/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>

#include "tests/data/scratch_files.h"

namespace partrain::data {
namespace {

DistributedSampler make(std::int64_t n, int world, int rank, std::uint64_t seed = 42) {
  SamplerOptions o;
  o.world_size = world;
  o.rank = rank;
  o.seed = seed;
  return DistributedSampler(n, o);
}

TEST(Sampler, PermutationIsIndependentOfWorldSizeAndRank) {
  const auto p1 = make(1000, 1, 0).permutation(3);
  EXPECT_EQ(p1, make(1000, 4, 2).permutation(3));
  std::vector<std::int64_t> sorted = p1;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(p1, identity);
}

TEST(Sampler, EpochsAndSeedsGiveDifferentOrders) {
  const auto s = make(500, 2, 0);
  EXPECT_NE(s.permutation(0), s.permutation(1));
  EXPECT_NE(s.indices(0), s.indices(1));
  EXPECT_NE(s.permutation(0), make(500, 2, 0, 43).permutation(0));
  EXPECT_EQ(s.indices(5), make(500, 2, 0).indices(5));
}

TEST(Sampler, ShardsAreDisjointAndCoverThePermutationWhenDivisible) {
  const int world = 4;
  std::set<std::int64_t> all;
  for (int r = 0; r < world; ++r) {
    const auto s = make(1000, world, r);
    EXPECT_EQ(s.num_samples(), 250);
    const auto mine = s.indices(2);
    ASSERT_EQ(static_cast<std::int64_t>(mine.size()), 250);
    for (auto i : mine) EXPECT_TRUE(all.insert(i).second) << "sample " << i << " twice";
  }
  EXPECT_EQ(all.size(), 1000u);
}

TEST(Sampler, PadsByWrappingToEqualLengths) {
  // 10 samples over 4 ranks: padded to 12 with the permutation's first two entries.
  const auto perm = make(10, 4, 0).permutation(0);
  std::vector<std::int64_t> padded = perm;
  padded.push_back(perm[0]);
  padded.push_back(perm[1]);
  std::multiset<std::int64_t> all;
  for (int r = 0; r < 4; ++r) {
    const auto s = make(10, 4, r);
    EXPECT_EQ(s.num_samples(), 3);
    EXPECT_EQ(s.total_size(), 12);
    const auto mine = s.indices(0);
    ASSERT_EQ(mine.size(), 3u);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(mine[k], padded[k * 4 + r]);
    all.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(all.size(), 12u);
  EXPECT_EQ(all.count(perm[0]), 2u);
  EXPECT_EQ(all.count(perm[1]), 2u);
  EXPECT_EQ(all.count(perm[2]), 1u);
  // More ranks than samples: everyone still gets one.
  EXPECT_EQ(make(3, 8, 7).indices(0), std::vector<std::int64_t>{make(3, 1, 0).permutation(0)[1]});
}

// W ranks at batch b see, step by step, the samples of one process at batch W*b.
TEST(Sampler, WRanksAtBatchBEqualOneProcessAtBatchWB) {
  for (int world : {2, 3, 4}) {
    const std::int64_t n = 960, b = 16;
    const auto single = make(n, 1, 0).indices(7);
    std::vector<std::vector<std::int64_t>> shards;
    for (int r = 0; r < world; ++r) shards.push_back(make(n, world, r).indices(7));
    const std::int64_t steps = make(n, world, 0).num_batches(b);
    EXPECT_EQ(steps, make(n, 1, 0).num_batches(world * b));
    for (std::int64_t k = 0; k < steps; ++k) {
      std::multiset<std::int64_t> ranks_step, single_step;
      for (int r = 0; r < world; ++r) {
        const auto& s = shards[static_cast<std::size_t>(r)];
        for (std::int64_t j = k * b; j < std::min<std::int64_t>((k + 1) * b, s.size()); ++j)
          ranks_step.insert(s[j]);
      }
      for (std::int64_t j = k * world * b; j < std::min<std::int64_t>((k + 1) * world * b, n);
           ++j) {
        single_step.insert(single[j]);
      }
      ASSERT_EQ(ranks_step, single_step) << "world " << world << " step " << k;
    }
  }
}

TEST(Sampler, LastBatchIsShortAndEquallyShortOnEveryRank) {
  // 1001 samples, 2 ranks: 501 each, batches of 100 -> 6 batches, the last of 1.
  for (int r = 0; r < 2; ++r) {
    const auto s = make(1001, 2, r);
    EXPECT_EQ(s.num_samples(), 501);
    EXPECT_EQ(s.num_batches(100), 6);
  }
  EXPECT_EQ(make(1000, 2, 0).num_batches(100), 5);
}

TEST(Sampler, NoShuffleIsTheIdentityOrder) {
  SamplerOptions o;
  o.world_size = 2;
  o.rank = 1;
  o.shuffle = false;
  const DistributedSampler s(5, o);
  EXPECT_EQ(s.indices(9), (std::vector<std::int64_t>{1, 3, 0}));
}

TEST(Sampler, BadArgumentsAreUsageErrors) {
  using ::testing::HasSubstr;
  EXPECT_THAT(test_files::usage_error_of([] { make(0, 1, 0); }), HasSubstr("empty"));
  EXPECT_THAT(test_files::usage_error_of([] { make(10, 2, 2); }),
              HasSubstr("rank 2 is outside 0..1"));
  EXPECT_THAT(test_files::usage_error_of([] { make(10, 0, 0); }), HasSubstr("world size"));
  EXPECT_THAT(test_files::usage_error_of([] { make(10, 1, 0).num_batches(0); }),
              HasSubstr("batch size"));
}

}  // namespace
}  // namespace partrain::data
