#include "trainer/data/sampler.h"

#include <numeric>

#include "common/errors.h"
#include "trainer/data/counter_rng.h"

namespace partrain::data {

DistributedSampler::DistributedSampler(std::int64_t dataset_size, SamplerOptions options)
    : dataset_size_(dataset_size), num_samples_(0), options_(options) {
  PARTRAIN_CHECK(dataset_size >= 1, UsageError, "sampler: the dataset is empty");
  PARTRAIN_CHECK(dataset_size < (std::int64_t{1} << 32), UsageError, "sampler: ", dataset_size,
                 " samples is more than the 2^32 - 1 supported");
  PARTRAIN_CHECK(options.world_size >= 1, UsageError, "sampler: world size must be >= 1, not ",
                 options.world_size);
  PARTRAIN_CHECK(options.rank >= 0 && options.rank < options.world_size, UsageError,
                 "sampler: rank ", options.rank, " is outside 0..", options.world_size - 1);
  num_samples_ = (dataset_size + options.world_size - 1) / options.world_size;
}

std::vector<std::int64_t> DistributedSampler::permutation(std::int64_t epoch) const {
  std::vector<std::int64_t> perm(static_cast<std::size_t>(dataset_size_));
  std::iota(perm.begin(), perm.end(), 0);
  if (!options_.shuffle) return perm;
  // Fisher-Yates from the back, driven by the (seed, epoch) stream.
  CounterRng rng(mix_seed(options_.seed, 0x5a3b1e, static_cast<std::uint64_t>(epoch)));
  for (std::size_t k = perm.size() - 1; k > 0; --k) {
    std::swap(perm[k], perm[rng.below(static_cast<std::uint32_t>(k + 1))]);
  }
  return perm;
}

std::vector<std::int64_t> DistributedSampler::indices(std::int64_t epoch) const {
  const std::vector<std::int64_t> perm = permutation(epoch);
  std::vector<std::int64_t> mine(static_cast<std::size_t>(num_samples_));
  const std::int64_t world = options_.world_size;
  for (std::int64_t k = 0; k < num_samples_; ++k) {
    // Positions past the end wrap to the front: the padding of the design note.
    const std::int64_t position = (k * world + options_.rank) % dataset_size_;
    mine[static_cast<std::size_t>(k)] = perm[static_cast<std::size_t>(position)];
  }
  return mine;
}

std::int64_t DistributedSampler::num_batches(std::int64_t batch_size) const {
  PARTRAIN_CHECK(batch_size >= 1, UsageError, "batch size must be >= 1, not ", batch_size);
  return (num_samples_ + batch_size - 1) / batch_size;
}

}  // namespace partrain::data
