#include "trainer/data/batch_plan.h"

#include "common/errors.h"
#include "trainer/data/sampler.h"

namespace partrain::data {

BatchPlan::BatchPlan(std::int64_t dataset_size, std::uint64_t seed,
                     std::vector<std::int64_t> shares)
    : dataset_size_(dataset_size), seed_(seed), shares_(std::move(shares)) {
  PARTRAIN_CHECK(dataset_size >= 1, UsageError, "batch plan: the dataset is empty");
  PARTRAIN_CHECK(!shares_.empty(), UsageError, "batch plan: no ranks to share the batch");
  for (std::size_t r = 0; r < shares_.size(); ++r) {
    PARTRAIN_CHECK(shares_[r] >= 1, UsageError, "batch plan: rank ", r, "'s share is ", shares_[r],
                   "; every rank needs at least 1 sample per micro-step");
    offsets_.push_back(micro_batch_);
    micro_batch_ += shares_[r];
  }
}

std::vector<std::int64_t> BatchPlan::even_shares(std::int64_t micro_batch, int world_size) {
  PARTRAIN_CHECK(world_size >= 1, UsageError, "batch plan: world size must be >= 1, not ",
                 world_size);
  PARTRAIN_CHECK(micro_batch >= world_size && micro_batch % world_size == 0, UsageError,
                 "batch plan: ", micro_batch, " samples per micro-step do not split evenly over ",
                 world_size, " ranks");
  return std::vector<std::int64_t>(static_cast<std::size_t>(world_size), micro_batch / world_size);
}

BatchPlan BatchPlan::with_shares(std::vector<std::int64_t> shares) const {
  BatchPlan plan(dataset_size_, seed_, std::move(shares));
  PARTRAIN_CHECK(plan.world_size() == world_size() && plan.micro_batch() == micro_batch_,
                 UsageError, "batch plan: ", plan.world_size(), " shares of ", plan.micro_batch(),
                 " samples cannot replace ", world_size(), " of ", micro_batch_);
  return plan;
}

void BatchPlan::check_rank(int rank) const {
  PARTRAIN_CHECK(rank >= 0 && rank < world_size(), UsageError, "batch plan: rank ", rank,
                 " is outside 0..", world_size() - 1);
}

std::int64_t BatchPlan::share(int rank) const {
  check_rank(rank);
  return shares_[static_cast<std::size_t>(rank)];
}

std::int64_t BatchPlan::offset(int rank) const {
  check_rank(rank);
  return offsets_[static_cast<std::size_t>(rank)];
}

std::vector<std::int64_t> BatchPlan::permutation(std::int64_t epoch) const {
  // World size 1, rank 0: the sampler's permutation does not depend on them.
  return DistributedSampler(dataset_size_, {1, 0, seed_, true}).permutation(epoch);
}

std::vector<std::int64_t> BatchPlan::indices(std::int64_t epoch, std::int64_t step,
                                             int rank) const {
  PARTRAIN_CHECK(step >= 0 && step < num_steps(), UsageError, "batch plan: micro-step ", step,
                 " is outside the epoch's 0..", num_steps() - 1);
  const std::vector<std::int64_t> perm = permutation(epoch);
  const std::int64_t begin = step * micro_batch_ + offset(rank);
  std::vector<std::int64_t> mine(static_cast<std::size_t>(share(rank)));
  for (std::size_t j = 0; j < mine.size(); ++j) {
    // Positions past the end wrap to the front: the padding of the design note.
    mine[j] =
        perm[static_cast<std::size_t>((begin + static_cast<std::int64_t>(j)) % dataset_size_)];
  }
  return mine;
}

std::vector<std::int64_t> BatchPlan::rank_indices(std::int64_t epoch, int rank) const {
  const std::vector<std::int64_t> perm = permutation(epoch);
  const std::int64_t b = share(rank);
  const std::int64_t off = offset(rank);
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_steps() * b));
  for (std::int64_t k = 0; k < num_steps(); ++k) {
    for (std::int64_t j = 0; j < b; ++j) {
      mine.push_back(perm[static_cast<std::size_t>((k * micro_batch_ + off + j) % dataset_size_)]);
    }
  }
  return mine;
}

}  // namespace partrain::data
