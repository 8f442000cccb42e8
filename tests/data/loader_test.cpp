#include "trainer/data/loader.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "common/errors.h"
#include "trainer/data/synthetic.h"

namespace partrain::data {
namespace {

std::shared_ptr<const ImageDataset> synthetic(std::int64_t n, std::uint64_t seed = 3) {
  SyntheticOptions o;
  o.size = n;
  o.seed = seed;
  return std::make_shared<const ImageDataset>(generate_synthetic(o));
}

DistributedSampler sampler(std::int64_t n, int world = 1, int rank = 0, bool shuffle = true) {
  SamplerOptions o;
  o.world_size = world;
  o.rank = rank;
  o.seed = 17;
  o.shuffle = shuffle;
  return DistributedSampler(n, o);
}

LoaderOptions options(std::int64_t batch, int workers, bool augment) {
  LoaderOptions o;
  o.batch_size = batch;
  o.num_workers = workers;
  o.augment = augment;
  o.seed = 5;
  o.timeout_s = 60;
  return o;
}

std::vector<Batch> epoch_of(Loader& loader, std::int64_t epoch, std::int64_t first = 0) {
  loader.start_epoch(epoch, first);
  std::vector<Batch> out;
  while (auto batch = loader.next()) out.push_back(std::move(*batch));
  return out;
}

TEST(Loader, BatchesDoNotDependOnTheNumberOfWorkers) {
  const auto data = synthetic(250);
  for (bool augment : {false, true}) {
    SCOPED_TRACE(augment ? "augment" : "plain");
    Loader reference(data, sampler(250), options(32, 0, augment));
    const auto expected = epoch_of(reference, 1);
    ASSERT_EQ(expected.size(), 8u);
    EXPECT_EQ(reference.num_batches(), 8);
    EXPECT_EQ(expected.back().count, 250 - 7 * 32);
    EXPECT_EQ(expected.back().images.size(0), 26);
    for (int workers : {1, 2, 3}) {
      Loader loader(data, sampler(250), options(32, workers, augment));
      const auto got = epoch_of(loader, 1);
      ASSERT_EQ(got.size(), expected.size()) << workers << " workers";
      for (std::size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].index, static_cast<std::int64_t>(k));
        EXPECT_TRUE(at::equal(got[k].images, expected[k].images))
            << workers << " workers, batch " << k;
        EXPECT_TRUE(at::equal(got[k].labels, expected[k].labels))
            << workers << " workers, batch " << k;
      }
    }
  }
}

// Global-batch mode: batch k of rank r is its slice of micro-step k; the ranks' batches
// together are the one-rank loader's batch k, whatever the world size, and resuming at a
// micro-step starts there.
TEST(Loader, BatchPlanBatchesAreEachRanksSliceOfTheMicroStep) {
  const auto data = synthetic(250);
  const BatchPlan one(250, 17, BatchPlan::even_shares(48, 1));
  Loader whole(data, one, 0, options(1, 0, false));
  const auto expected = epoch_of(whole, 2);
  ASSERT_EQ(expected.size(), 6u);  // ceil(250 / 48), the last wrapping
  EXPECT_EQ(expected.back().count, 48);
  for (int world : {2, 3}) {
    std::vector<std::vector<Batch>> ranks;
    for (int r = 0; r < world; ++r) {
      Loader loader(data, BatchPlan(250, 17, BatchPlan::even_shares(48, world)), r,
                    options(7, r % 2 + 1, false));
      EXPECT_EQ(loader.num_batches(), 6);
      ranks.push_back(epoch_of(loader, 2));
      EXPECT_TRUE(at::equal(epoch_of(loader, 2, 4).front().labels, ranks.back()[4].labels));
    }
    for (std::size_t k = 0; k < expected.size(); ++k) {
      std::vector<at::Tensor> labels, images;
      for (const auto& batches : ranks) {
        ASSERT_EQ(batches[k].count, 48 / world);
        labels.push_back(batches[k].labels);
        images.push_back(batches[k].images);
      }
      EXPECT_TRUE(at::equal(at::cat(labels), expected[k].labels)) << world << " ranks, step " << k;
      EXPECT_TRUE(at::equal(at::cat(images), expected[k].images)) << world << " ranks, step " << k;
    }
  }
}

TEST(Loader, NewSharesMidEpochCutTheSameMicroStepsElsewhere) {
  const auto data = synthetic(250);
  const BatchPlan one(250, 17, BatchPlan::even_shares(48, 1));
  Loader whole(data, one, 0, options(1, 0, false));
  const auto expected = epoch_of(whole, 2);
  // Two ranks, even for 2 micro-steps, then 36 and 12 (what data.balance auto does mid-epoch).
  std::vector<std::vector<Batch>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    Loader loader(data, BatchPlan(250, 17, BatchPlan::even_shares(48, 2)), r,
                  options(7, r + 1, false));
    loader.start_epoch(2);
    for (int k = 0; k < 2; ++k) ranks[r].push_back(*loader.next());
    loader.set_shares({36, 12});
    while (auto batch = loader.next()) ranks[r].push_back(std::move(*batch));
  }
  ASSERT_EQ(ranks[0].size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_EQ(ranks[0][k].count, k < 2 ? 24 : 36) << k;
    EXPECT_EQ(ranks[1][k].count, k < 2 ? 24 : 12) << k;
    EXPECT_EQ(ranks[1][k].index, static_cast<std::int64_t>(k));
    EXPECT_TRUE(at::equal(at::cat({ranks[0][k].labels, ranks[1][k].labels}), expected[k].labels))
        << "step " << k;
    EXPECT_TRUE(at::equal(at::cat({ranks[0][k].images, ranks[1][k].images}), expected[k].images))
        << "step " << k;
  }
  Loader loader(data, one, 0, options(1, 0, false));
  EXPECT_THROW(loader.set_shares({24, 24}), UsageError);  // another world size
  Loader pair(data, BatchPlan(250, 17, BatchPlan::even_shares(48, 2)), 0, options(1, 0, false));
  EXPECT_THROW(pair.set_shares({24, 23}), UsageError);  // another micro-batch
}

TEST(Loader, ImagesAreNormalisedWithTheDatasetStatistics) {
  const auto data = synthetic(40);
  Loader loader(data, sampler(40, 1, 0, /*shuffle=*/false), options(16, 2, false));
  const auto batches = epoch_of(loader, 0);
  const Batch& b = batches[1];  // samples 16..31
  ASSERT_EQ(b.images.sizes(), (std::vector<std::int64_t>{16, 3, 32, 32}));
  EXPECT_EQ(b.images.scalar_type(), at::kFloat);
  EXPECT_EQ(b.labels.scalar_type(), at::kLong);
  const auto images = b.images.accessor<float, 4>();
  for (int j : {0, 7, 15}) {
    EXPECT_EQ(b.labels[j].item<std::int64_t>(), data->labels[16 + j]);
    for (int c = 0; c < 3; ++c) {
      for (int p : {0, 33, 1023}) {
        const float raw = data->image(16 + j)[c * 1024 + p];
        EXPECT_FLOAT_EQ(images[j][c][p / 32][p % 32],
                        (raw / 255.0f - data->mean[c]) / data->std[c]);
      }
    }
  }
  // Over the whole set, normalised channels have mean ~0 and std ~1.
  const at::Tensor all = at::cat({batches[0].images, batches[1].images, batches[2].images});
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(all.select(1, c).mean().item<float>(), 0.0f, 1e-3);
    EXPECT_NEAR(all.select(1, c).std().item<float>(), 1.0f, 1e-2);
  }
}

// Each augmented image is its source, zero-padded by 4, cropped back at some offset and maybe
// mirrored; the draw depends on the epoch.
TEST(Loader, AugmentationIsAPaddedCropAndFlipSeededPerEpoch) {
  const auto data = synthetic(24);
  Loader plain(data, sampler(24, 1, 0, false), options(24, 0, false));
  Loader augmented(data, sampler(24, 1, 0, false), options(24, 1, true));
  const at::Tensor x = epoch_of(plain, 0)[0].images;
  const at::Tensor a0 = epoch_of(augmented, 0)[0].images;
  const at::Tensor a1 = epoch_of(augmented, 1)[0].images;
  EXPECT_FALSE(at::equal(a0, a1));
  int changed = 0;
  for (int j = 0; j < 24; ++j) {
    // Zero pixels normalise to -mean/std per channel.
    const at::Tensor fill =
        at::tensor({-data->mean[0] / data->std[0], -data->mean[1] / data->std[1],
                    -data->mean[2] / data->std[2]})
            .view({3, 1, 1});
    const at::Tensor padded = fill.expand({3, 40, 40}).clone();
    padded.slice(1, 4, 36).slice(2, 4, 36).copy_(x[j]);
    bool found = false;
    for (int dy = 0; dy <= 8 && !found; ++dy) {
      for (int dx = 0; dx <= 8 && !found; ++dx) {
        const at::Tensor crop = padded.slice(1, dy, dy + 32).slice(2, dx, dx + 32);
        found = at::equal(crop, a0[j]) || at::equal(crop.flip({2}), a0[j]);
      }
    }
    EXPECT_TRUE(found) << "sample " << j << " is not a padded crop of its source";
    changed += !at::equal(x[j], a0[j]);
  }
  EXPECT_GT(changed, 12);
}

TEST(Loader, ResumingMidEpochGivesTheRemainingBatches) {
  const auto data = synthetic(100);
  Loader loader(data, sampler(100), options(10, 2, true));
  const auto full = epoch_of(loader, 4);
  const auto tail = epoch_of(loader, 4, 6);
  ASSERT_EQ(tail.size(), 4u);
  for (std::size_t k = 0; k < tail.size(); ++k) {
    EXPECT_EQ(tail[k].index, static_cast<std::int64_t>(6 + k));
    EXPECT_TRUE(at::equal(tail[k].images, full[6 + k].images));
  }
  EXPECT_TRUE(at::equal(loader.make_batch(4, 2).images, full[2].images));
  // Leaving an epoch half-read and starting another neither hangs nor mixes epochs.
  loader.start_epoch(5);
  ASSERT_TRUE(loader.next().has_value());
  const auto next_epoch = epoch_of(loader, 6);
  EXPECT_EQ(next_epoch.size(), 10u);
  EXPECT_TRUE(at::equal(next_epoch[0].images, loader.make_batch(6, 0).images));
}

TEST(Loader, TwoRanksAtBatchBSeeWhatOneProcessSeesAtBatch2B) {
  const auto data = synthetic(96);
  Loader single(data, sampler(96, 1, 0), options(32, 1, true));
  Loader rank0(data, sampler(96, 2, 0), options(16, 2, true));
  Loader rank1(data, sampler(96, 2, 1), options(16, 0, true));
  const auto s = epoch_of(single, 2), r0 = epoch_of(rank0, 2), r1 = epoch_of(rank1, 2);
  ASSERT_EQ(s.size(), 3u);
  ASSERT_EQ(r0.size(), 3u);
  for (std::size_t k = 0; k < s.size(); ++k) {
    // The same samples, with the same augmentation, in a different order within the step.
    const at::Tensor both = at::cat({r0[k].images, r1[k].images}).flatten(1);
    const at::Tensor labels = at::cat({r0[k].labels, r1[k].labels});
    EXPECT_TRUE(at::equal(std::get<0>(labels.sort()), std::get<0>(s[k].labels.sort())));
    const at::Tensor expected = s[k].images.flatten(1);
    std::vector<bool> used(static_cast<std::size_t>(expected.size(0)), false);
    for (std::int64_t i = 0; i < both.size(0); ++i) {
      bool matched = false;
      for (std::int64_t e = 0; e < expected.size(0) && !matched; ++e) {
        if (!used[static_cast<std::size_t>(e)] && at::equal(both[i], expected[e])) {
          used[static_cast<std::size_t>(e)] = matched = true;
        }
      }
      EXPECT_TRUE(matched) << "step " << k << ": rank image " << i << " not in the single batch";
    }
  }
}

TEST(Loader, WaitingForAStuckWorkerIsBounded) {
  const auto data = synthetic(2000);
  LoaderOptions o = options(2000, 1, true);
  o.timeout_s = 1e-6;  // far shorter than building a 2000-image batch takes
  Loader loader(data, sampler(2000), o);
  loader.start_epoch(0);
  try {
    loader.next();
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("data loader: batch 0 of epoch 0 not ready after"));
  }
}

TEST(Loader, RejectsMismatchedSamplerAndBadOptions) {
  const auto data = synthetic(30);
  EXPECT_THROW(Loader(data, sampler(31), options(8, 0, false)), Error);
  EXPECT_THROW(Loader(data, sampler(30), options(0, 0, false)), UsageError);
  EXPECT_THROW(Loader(data, sampler(30), options(8, -1, false)), UsageError);
  Loader loader(data, sampler(30), options(8, 0, false));
  EXPECT_THROW(loader.next(), Error);  // before start_epoch
  EXPECT_THROW(loader.start_epoch(0, 5), UsageError);
}

}  // namespace
}  // namespace partrain::data
