#include "trainer/data/synthetic.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "tests/data/scratch_files.h"

namespace partrain::data {
namespace {

SyntheticOptions options(std::int64_t size, std::uint64_t seed, bool train = true) {
  SyntheticOptions o;
  o.size = size;
  o.seed = seed;
  o.train = train;
  return o;
}

TEST(Synthetic, IsCifarShapedAndDeterministicPerSeed) {
  const ImageDataset a = generate_synthetic(options(300, 7));
  const ImageDataset b = generate_synthetic(options(300, 7));
  EXPECT_EQ(a.size, 300);
  EXPECT_EQ(a.channels, 3);
  EXPECT_EQ(a.height, 32);
  EXPECT_EQ(a.width, 32);
  EXPECT_EQ(a.num_classes, 100);
  EXPECT_EQ(a.pixels.size(), 300u * 3072u);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.mean, b.mean);

  const ImageDataset other_seed = generate_synthetic(options(300, 8));
  EXPECT_NE(a.pixels, other_seed.pixels);
  EXPECT_NE(a.labels, other_seed.labels);
  const ImageDataset test_split = generate_synthetic(options(300, 7, false));
  EXPECT_NE(a.pixels, test_split.pixels);
}

TEST(Synthetic, APrefixIsTheSameAsASmallerSet) {
  const ImageDataset big = generate_synthetic(options(250, 3));
  const ImageDataset small = generate_synthetic(options(120, 3));
  EXPECT_TRUE(std::equal(small.pixels.begin(), small.pixels.end(), big.pixels.begin()));
  EXPECT_TRUE(std::equal(small.labels.begin(), small.labels.end(), big.labels.begin()));
}

TEST(Synthetic, EveryBlockOfNumClassesHoldsEachClassOnce) {
  const ImageDataset d = generate_synthetic(options(200, 1));
  for (int block = 0; block < 2; ++block) {
    std::vector<int> seen(100, 0);
    for (int i = 0; i < 100; ++i) seen[static_cast<std::size_t>(d.labels[block * 100 + i])]++;
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 100);
  }
}

TEST(Synthetic, StatisticsAreMeasuredOnTheImages) {
  const ImageDataset d = generate_synthetic(options(200, 5));
  ASSERT_EQ(d.mean.size(), 3u);
  std::vector<float> mean, std;
  compute_channel_stats(d, mean, std);
  for (int c = 0; c < 3; ++c) {
    EXPECT_FLOAT_EQ(d.mean[c], mean[c]);
    // Colours spread over 0.15..0.85 plus grating and noise: mean near 0.5, std well above
    // the noise alone.
    EXPECT_NEAR(d.mean[c], 0.5, 0.08);
    EXPECT_GT(d.std[c], 0.15);
    EXPECT_LT(d.std[c], 0.35);
  }
}

// Learnable: the nearest class-mean colour, measured on the training split, already
// classifies held-out images far above chance (1%); a CNN also sees the gratings.
TEST(Synthetic, ClassesAreSeparableByAnEstimatedTemplate) {
  const ImageDataset train = generate_synthetic(options(2000, 11));
  const ImageDataset test = generate_synthetic(options(500, 11, false));
  const int plane = 32 * 32;
  auto mean_colour = [&](const ImageDataset& d, std::int64_t i, int c) {
    double s = 0;
    for (int p = 0; p < plane; ++p) s += d.image(i)[c * plane + p];
    return s / plane;
  };
  std::vector<double> centre(300, 0.0);
  std::vector<int> count(100, 0);
  for (std::int64_t i = 0; i < train.size; ++i) {
    const auto k = static_cast<std::size_t>(train.labels[static_cast<std::size_t>(i)]);
    count[k]++;
    for (int c = 0; c < 3; ++c) centre[k * 3 + c] += mean_colour(train, i, c);
  }
  for (std::size_t k = 0; k < 100; ++k) {
    for (int c = 0; c < 3; ++c) centre[k * 3 + c] /= count[k];
  }
  int correct = 0;
  for (std::int64_t i = 0; i < test.size; ++i) {
    double best = 1e30;
    std::size_t best_k = 0;
    for (std::size_t k = 0; k < 100; ++k) {
      double dist = 0;
      for (int c = 0; c < 3; ++c) dist += std::pow(mean_colour(test, i, c) - centre[k * 3 + c], 2);
      if (dist < best) {
        best = dist;
        best_k = k;
      }
    }
    correct += static_cast<std::int64_t>(best_k) == test.labels[static_cast<std::size_t>(i)];
  }
  EXPECT_GT(correct, 250) << "nearest-colour accuracy " << correct << "/500";
}

TEST(Synthetic, BadSizesAreUsageErrors) {
  EXPECT_THAT(test_files::usage_error_of([] { generate_synthetic(options(0, 1)); }),
              ::testing::HasSubstr("size must be positive"));
  EXPECT_THAT(test_files::usage_error_of([] { generate_synthetic(options(2'000'000'000, 1)); }),
              ::testing::HasSubstr("exceeds the"));
}

}  // namespace
}  // namespace partrain::data
