// defines: DistributedSampler — which samples each rank visits in an epoch, and in which
// order (after PyTorch's torch.utils.data.DistributedSampler).
//
// Shape of one epoch, n samples, W ranks:
//   perm = permutation of 0..n-1 drawn from (seed, epoch)   — the same for every W
//   padded = perm followed by perm[0], perm[1], ... until its length is a multiple of W
//   rank r gets padded[r], padded[r + W], padded[r + 2W], ...
// Every rank gets ceil(n / W) samples. Cut into batches of b, step k of rank r covers
// padded positions (k*b + j)*W + r for j < b; over all ranks that is exactly positions
// k*W*b .. k*W*b + W*b - 1, i.e. step k of one process at batch W*b. That is why W ranks at
// batch b and one process at batch W*b train on the same samples step by step.
#pragma once

#include <cstdint>
#include <vector>

namespace partrain::data {

struct SamplerOptions {
  int world_size = 1;
  int rank = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;  // false: identity order (evaluation)
};

class DistributedSampler {
 public:
  // Throws UsageError when dataset_size < 1, world_size < 1 or rank is outside [0, W).
  DistributedSampler(std::int64_t dataset_size, SamplerOptions options);

  std::int64_t dataset_size() const { return dataset_size_; }
  // Samples this rank visits per epoch: ceil(dataset_size / world_size).
  std::int64_t num_samples() const { return num_samples_; }
  // num_samples() * world_size: the padded length of the permutation.
  std::int64_t total_size() const { return num_samples_ * options_.world_size; }
  const SamplerOptions& options() const { return options_; }

  // The full permutation of epoch `epoch` (dataset_size entries), the same on every rank.
  std::vector<std::int64_t> permutation(std::int64_t epoch) const;
  // This rank's dataset indices for epoch `epoch`, in visiting order (num_samples()).
  std::vector<std::int64_t> indices(std::int64_t epoch) const;
  // Batches per epoch with drop_last = false: ceil(num_samples() / batch_size); only the
  // last may be short, and it is equally short on every rank.
  std::int64_t num_batches(std::int64_t batch_size) const;

 private:
  std::int64_t dataset_size_;
  std::int64_t num_samples_;
  SamplerOptions options_;
};

}  // namespace partrain::data
