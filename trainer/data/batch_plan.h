// defines: BatchPlan — in global-batch mode, which samples each rank trains on at each
// micro-step of an epoch, so that the run sees the same samples in the same groups whatever
// its world size.
//
// Shape of one epoch, n samples, micro-batch M (samples per micro-step over all ranks),
// shares b_0 .. b_{W-1} (samples per rank, summing to M):
//   perm    = DistributedSampler's permutation of 0..n-1 for (seed, epoch) — the same for every W
//   plan    = perm followed by perm[0], perm[1], ... until its length is a multiple of M
//   micro-step k covers plan positions [k*M, (k+1)*M)
//   rank r takes the contiguous slice [k*M + off_r, k*M + off_r + b_r), off_r = b_0+..+b_{r-1}
//
//      k*M                                          (k+1)*M
//       | rank 0: b_0 | rank 1: b_1 | ... | rank W-1 |
//
// So micro-step k's samples, over all ranks, depend on n, the seed, the epoch and M only; a
// run of W ranks and one of W' ranks at the same M train on the same samples step by step,
// and a position counted in micro-steps means the same for both. Shares are a vector so that
// uneven splits fit; even_shares() builds today's even one.
#pragma once

#include <cstdint>
#include <vector>

namespace partrain::data {

class BatchPlan {
 public:
  // Throws UsageError when dataset_size < 1, shares is empty, or a share is < 1.
  BatchPlan(std::int64_t dataset_size, std::uint64_t seed, std::vector<std::int64_t> shares);

  // M split evenly over W ranks: W shares of M / W. Throws UsageError when W < 1 or W does not
  // divide M.
  static std::vector<std::int64_t> even_shares(std::int64_t micro_batch, int world_size);

  // The same data set and seed cut by other shares of the same micro-batch: every micro-step
  // holds the same samples as before, split elsewhere. Throws UsageError when the shares are
  // for another world size or sum to another M.
  BatchPlan with_shares(std::vector<std::int64_t> shares) const;

  std::int64_t dataset_size() const { return dataset_size_; }
  const std::vector<std::int64_t>& shares() const { return shares_; }
  int world_size() const { return static_cast<int>(shares_.size()); }
  std::int64_t micro_batch() const { return micro_batch_; }  // M: the sum of the shares
  std::int64_t share(int rank) const;
  std::int64_t offset(int rank) const;  // off_r: the shares of the ranks before `rank`
  // Micro-steps per epoch: ceil(n / M), each exactly M samples (the last one wraps).
  std::int64_t num_steps() const { return (dataset_size_ + micro_batch_ - 1) / micro_batch_; }

  // The epoch's permutation of the whole data set (n entries), the same for every W.
  std::vector<std::int64_t> permutation(std::int64_t epoch) const;
  // Rank `rank`'s dataset indices at micro-step `step` of `epoch` (share(rank) of them).
  std::vector<std::int64_t> indices(std::int64_t epoch, std::int64_t step, int rank) const;
  // Rank `rank`'s indices of every micro-step of `epoch`, in order: micro-step k is entries
  // [k * share(rank), (k + 1) * share(rank)).
  std::vector<std::int64_t> rank_indices(std::int64_t epoch, int rank) const;

 private:
  void check_rank(int rank) const;

  std::int64_t dataset_size_;
  std::uint64_t seed_;
  std::vector<std::int64_t> shares_;
  std::vector<std::int64_t> offsets_;
  std::int64_t micro_batch_ = 0;
};

}  // namespace partrain::data
