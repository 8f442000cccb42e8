// assign_buckets(), the rule that lays DDP's parameters into gradient buckets: reverse order,
// a small first bucket, a parameter larger than a cap alone in its bucket, exact boundaries,
// zero-size parameters, caps counted in elements of the parameters' dtype.
#include "trainer/parallel/bucket_assignment.h"

#include <gtest/gtest.h>

#include <numeric>

namespace partrain {
namespace {

using Indices = std::vector<std::size_t>;

// Caps of 256 elements for bucket 0 and 1024 for the others, for 4-byte elements.
constexpr std::size_t kF32 = 4;
const BucketCaps kCaps{4.0 / 1024, 1.0 / 1024};

std::vector<Indices> params_of(const std::vector<BucketLayout>& buckets) {
  std::vector<Indices> params;
  for (const auto& b : buckets) params.push_back(b.params);
  return params;
}

TEST(ReducerBuckets, ReverseOrderWithASmallFirstBucket) {
  const auto buckets = assign_buckets(Indices(10, 100), kF32, kCaps);
  // 256 elements hold two parameters of 100; 1024 hold the remaining eight.
  ASSERT_EQ(params_of(buckets), (std::vector<Indices>{{9, 8}, {7, 6, 5, 4, 3, 2, 1, 0}}));
  EXPECT_EQ(buckets[0].offsets, (Indices{0, 100}));
  EXPECT_EQ(buckets[0].elements, 200u);
  EXPECT_EQ(buckets[1].offsets, (Indices{0, 100, 200, 300, 400, 500, 600, 700}));
  EXPECT_EQ(buckets[1].elements, 800u);
}

TEST(ReducerBuckets, ABucketFilledExactlyToItsCapKeepsTheParameter) {
  EXPECT_EQ(params_of(assign_buckets({128, 128}, kF32, kCaps)), (std::vector<Indices>{{1, 0}}));
  EXPECT_EQ(params_of(assign_buckets({129, 128}, kF32, kCaps)), (std::vector<Indices>{{1}, {0}}));
  // The same at the cap of the later buckets: 1024 fits, 1025 does not.
  EXPECT_EQ(params_of(assign_buckets({24, 1000, 256}, kF32, kCaps)),
            (std::vector<Indices>{{2}, {1, 0}}));
  EXPECT_EQ(params_of(assign_buckets({25, 1000, 256}, kF32, kCaps)),
            (std::vector<Indices>{{2}, {1}, {0}}));
}

TEST(ReducerBuckets, AParameterLargerThanTheCapGetsABucketOfItsOwn) {
  const auto buckets = assign_buckets({10, 5000, 10}, kF32, kCaps);
  ASSERT_EQ(params_of(buckets), (std::vector<Indices>{{2}, {1}, {0}}));
  EXPECT_EQ(buckets[1].elements, 5000u);
  EXPECT_EQ(buckets[1].offsets, (Indices{0}));
  // Also as the very first parameter laid: it opens bucket 0, whatever its cap.
  EXPECT_EQ(params_of(assign_buckets({10, 5000}, kF32, kCaps)), (std::vector<Indices>{{1}, {0}}));
}

TEST(ReducerBuckets, ZeroSizeParametersTakeNoRoom) {
  // A bucket of zero-size parameters is still empty, so it takes the 300 after them although
  // that passes its cap; the bucket, past its cap, then closes before the next parameter
  // whatever its size. No offset moves for them.
  const auto buckets = assign_buckets({5, 0, 300, 0, 0}, kF32, kCaps);
  ASSERT_EQ(params_of(buckets), (std::vector<Indices>{{4, 3, 2}, {1, 0}}));
  EXPECT_EQ(buckets[0].offsets, (Indices{0, 0, 0}));
  EXPECT_EQ(buckets[0].elements, 300u);
  EXPECT_EQ(buckets[1].offsets, (Indices{0, 0}));
  EXPECT_EQ(buckets[1].elements, 5u);
  // Only zero-size parameters: one bucket of no elements, so every rank still reduces it.
  const auto empty = assign_buckets({0, 0}, kF32, kCaps);
  ASSERT_EQ(params_of(empty), (std::vector<Indices>{{1, 0}}));
  EXPECT_EQ(empty[0].elements, 0u);
}

TEST(ReducerBuckets, TheFirstBucketTakesTheSmallerOfTheTwoCaps) {
  // first_bucket_mb above bucket_mb: bucket 0 is capped at bucket_mb (256 elements) too.
  const BucketCaps caps{1.0 / 1024, 4.0 / 1024};
  EXPECT_EQ(params_of(assign_buckets({200, 200, 200}, kF32, caps)),
            (std::vector<Indices>{{2}, {1}, {0}}));
  EXPECT_EQ(params_of(assign_buckets({200, 200, 200}, kF32, kCaps)),
            (std::vector<Indices>{{2}, {1, 0}}));
}

TEST(ReducerBuckets, CapsCountElementsOfTheParametersDtype) {
  // With 2-byte elements the same megabytes hold twice the elements.
  EXPECT_EQ(params_of(assign_buckets({200, 200}, kF32, kCaps)), (std::vector<Indices>{{1}, {0}}));
  EXPECT_EQ(params_of(assign_buckets({200, 200}, 2, kCaps)), (std::vector<Indices>{{1, 0}}));
  // The caps are 25 MiB and 1 MiB by default: 262144 f32 elements in the first bucket.
  const BucketCaps defaults{25.0, 1.0};
  EXPECT_EQ(params_of(assign_buckets({1, 262143, 1}, kF32, defaults)),
            (std::vector<Indices>{{2, 1}, {0}}));
}

TEST(ReducerBuckets, ACapBelowOneElementStillHoldsOne) {
  const BucketCaps tiny{1e-9, 1e-9};
  EXPECT_EQ(params_of(assign_buckets({1, 1, 1}, kF32, tiny)),
            (std::vector<Indices>{{2}, {1}, {0}}));
}

TEST(ReducerBuckets, EveryParameterOnceInReverseOrderAndNoBucketsForNone) {
  EXPECT_TRUE(assign_buckets({}, kF32, kCaps).empty());
  Indices counts;
  for (std::size_t k = 0; k < 40; ++k) counts.push_back((k * 37) % 301);
  const auto buckets = assign_buckets(counts, kF32, kCaps);
  Indices laid;
  for (const auto& b : buckets) {
    ASSERT_EQ(b.offsets.size(), b.params.size());
    std::size_t offset = 0;
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      EXPECT_EQ(b.offsets[i], offset);
      offset += counts[b.params[i]];
      laid.push_back(b.params[i]);
    }
    EXPECT_EQ(b.elements, offset);
  }
  Indices reversed(counts.size());
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  EXPECT_EQ(laid, reversed);
}

}  // namespace
}  // namespace partrain
