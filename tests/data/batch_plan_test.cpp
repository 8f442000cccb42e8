#include "trainer/data/batch_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "common/errors.h"
#include "trainer/data/sampler.h"

namespace partrain::data {
namespace {

// All ranks' samples of micro-step `step`, in rank order.
std::vector<std::int64_t> whole_step(const BatchPlan& plan, std::int64_t epoch, std::int64_t step) {
  std::vector<std::int64_t> all;
  for (int r = 0; r < plan.world_size(); ++r) {
    const std::vector<std::int64_t> mine = plan.indices(epoch, step, r);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

TEST(BatchPlan, SlicesCoverEachMicroStepExactlyOnce) {
  // 23 samples, M = 6: 4 micro-steps, 24 positions, the last wrapping to perm[0].
  const BatchPlan plan(23, 7, BatchPlan::even_shares(6, 3));
  ASSERT_EQ(plan.num_steps(), 4);
  ASSERT_EQ(plan.micro_batch(), 6);
  const std::vector<std::int64_t> perm = plan.permutation(2);
  for (std::int64_t k = 0; k < plan.num_steps(); ++k) {
    const std::vector<std::int64_t> all = whole_step(plan, 2, k);
    ASSERT_EQ(all.size(), 6u);
    for (std::size_t j = 0; j < all.size(); ++j) {
      EXPECT_EQ(all[j], perm[(static_cast<std::size_t>(k) * 6 + j) % 23]) << "step " << k;
    }
  }
  // Every sample once over the epoch, plus the one wrapped position.
  std::map<std::int64_t, int> seen;
  for (std::int64_t k = 0; k < plan.num_steps(); ++k) {
    for (std::int64_t i : whole_step(plan, 2, k)) ++seen[i];
  }
  ASSERT_EQ(seen.size(), 23u);
  for (const auto& [index, count] : seen) EXPECT_EQ(count, index == perm[0] ? 2 : 1) << index;
}

TEST(BatchPlan, WrapsToTheStartOfThePermutation) {
  const BatchPlan plan(10, 1, BatchPlan::even_shares(4, 2));
  ASSERT_EQ(plan.num_steps(), 3);
  const std::vector<std::int64_t> perm = plan.permutation(0);
  // Step 2 covers positions 8..11: perm[8], perm[9], then perm[0], perm[1].
  EXPECT_EQ(plan.indices(0, 2, 0), (std::vector<std::int64_t>{perm[8], perm[9]}));
  EXPECT_EQ(plan.indices(0, 2, 1), (std::vector<std::int64_t>{perm[0], perm[1]}));
  // Exact multiple: no wrap, no extra step.
  EXPECT_EQ(BatchPlan(12, 1, BatchPlan::even_shares(4, 2)).num_steps(), 3);
  // A micro-batch larger than the data set wraps more than once.
  const BatchPlan big(3, 1, BatchPlan::even_shares(8, 1));
  ASSERT_EQ(big.num_steps(), 1);
  const std::vector<std::int64_t> p3 = big.permutation(0);
  EXPECT_EQ(big.indices(0, 0, 0),
            (std::vector<std::int64_t>{p3[0], p3[1], p3[2], p3[0], p3[1], p3[2], p3[0], p3[1]}));
}

TEST(BatchPlan, MicroStepsAreIndependentOfTheWorldSize) {
  const BatchPlan one(1001, 42, BatchPlan::even_shares(24, 1));
  for (int world : {2, 3, 4, 6, 8, 12, 24}) {
    const BatchPlan many(1001, 42, BatchPlan::even_shares(24, world));
    ASSERT_EQ(many.num_steps(), one.num_steps());
    for (std::int64_t epoch : {0, 5}) {
      for (std::int64_t k : {std::int64_t{0}, std::int64_t{17}, one.num_steps() - 1}) {
        EXPECT_EQ(whole_step(many, epoch, k), one.indices(epoch, k, 0))
            << "W " << world << " epoch " << epoch << " step " << k;
      }
    }
  }
  // The permutation is the sampler's, whatever the world size.
  EXPECT_EQ(one.permutation(3), DistributedSampler(1001, {4, 1, 42, true}).permutation(3));
  EXPECT_NE(one.permutation(3), one.permutation(4));
}

TEST(BatchPlan, UnevenSharesTakeContiguousSlicesInRankOrder) {
  const BatchPlan plan(50, 3, {1, 4, 2});
  EXPECT_EQ(plan.micro_batch(), 7);
  EXPECT_EQ(plan.offset(0), 0);
  EXPECT_EQ(plan.offset(1), 1);
  EXPECT_EQ(plan.offset(2), 5);
  EXPECT_EQ(plan.num_steps(), 8);  // ceil(50 / 7)
  const BatchPlan single(50, 3, {7});
  for (std::int64_t k = 0; k < plan.num_steps(); ++k) {
    EXPECT_EQ(whole_step(plan, 1, k), single.indices(1, k, 0)) << "step " << k;
  }
  EXPECT_EQ(plan.indices(1, 3, 1).size(), 4u);
}

TEST(BatchPlan, RankIndicesAreTheMicroStepsInOrder) {
  const BatchPlan plan(37, 9, {3, 5});
  for (int r = 0; r < 2; ++r) {
    const std::vector<std::int64_t> all = plan.rank_indices(4, r);
    ASSERT_EQ(static_cast<std::int64_t>(all.size()), plan.num_steps() * plan.share(r));
    for (std::int64_t k = 0; k < plan.num_steps(); ++k) {
      const std::vector<std::int64_t> step(all.begin() + k * plan.share(r),
                                           all.begin() + (k + 1) * plan.share(r));
      EXPECT_EQ(step, plan.indices(4, k, r)) << "rank " << r << " step " << k;
    }
  }
}

TEST(BatchPlan, RefusesWhatCannotBeSplit) {
  EXPECT_EQ(BatchPlan::even_shares(12, 4), (std::vector<std::int64_t>{3, 3, 3, 3}));
  EXPECT_THROW(BatchPlan::even_shares(10, 4), UsageError);
  EXPECT_THROW(BatchPlan::even_shares(2, 4), UsageError);
  EXPECT_THROW(BatchPlan::even_shares(8, 0), UsageError);
  EXPECT_THROW(BatchPlan(0, 1, {2}), UsageError);
  EXPECT_THROW(BatchPlan(10, 1, {}), UsageError);
  EXPECT_THROW(BatchPlan(10, 1, {2, 0}), UsageError);
  const BatchPlan plan(10, 1, {2, 2});
  EXPECT_THROW(plan.indices(0, 3, 0), UsageError);
  EXPECT_THROW(plan.indices(0, 0, 2), UsageError);
}

}  // namespace
}  // namespace partrain::data
