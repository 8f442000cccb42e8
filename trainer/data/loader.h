// defines: Loader (batches of normalised float tensors for one rank, prepared ahead by
// worker threads), LoaderOptions and Batch.
//
// Order and content of the batches depend only on the dataset, the sampler (or, in global-batch
// mode, the batch plan and the rank), the batch size, the seed and the epoch — never on num_workers
// or thread timing: batch k of an epoch is always built from the sampler's positions k*b ..
// k*b+b-1, and augmentation draws from a random stream keyed by (seed, epoch, dataset index).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "trainer/data/batch_plan.h"
#include "trainer/data/dataset.h"
#include "trainer/data/sampler.h"

namespace partrain::data {

struct LoaderOptions {
  std::int64_t batch_size = 128;
  int num_workers = 0;       // 0: batches are built in the thread that calls next()
  int prefetch_batches = 2;  // per worker: how far ahead of next() the workers may run
  bool augment = false;      // random crop (4-pixel zero padding) + horizontal flip
  std::uint64_t seed = 0;
  double timeout_s = 300.0;  // next() gives up waiting for a worker after this long
};

struct Batch {
  at::Tensor images;  // float32 [count, C, H, W], (x / 255 - mean) / std per channel
  at::Tensor labels;  // int64 [count]
  std::int64_t count = 0;
  std::int64_t index = 0;  // batch number within the epoch
};

class Loader {
 public:
  // The dataset is shared so worker threads can never outlive it.
  Loader(std::shared_ptr<const ImageDataset> dataset, DistributedSampler sampler,
         LoaderOptions options);
  // Global-batch mode: batch k of an epoch is rank `rank`'s slice of micro-step k of `plan`
  // (options.batch_size is replaced by the rank's share). sampler() is then the
  // DistributedSampler of the same world, rank and seed, for its sizes only.
  Loader(std::shared_ptr<const ImageDataset> dataset, BatchPlan plan, int rank,
         LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts (or restarts) epoch `epoch` at batch `first_batch` (to resume mid-epoch); stops
  // the previous epoch's workers first.
  void start_epoch(std::int64_t epoch, std::int64_t first_batch = 0);
  // The next batch of the current epoch, or nullopt after the last one. Throws Error when a
  // worker failed or no batch arrived within timeout_s.
  std::optional<Batch> next();
  // Global-batch mode: from the next batch on, this rank's slices of the same micro-steps cut
  // by `shares` (the same micro-batch M; BatchPlan::with_shares). The batches prepared ahead
  // are built again. Throws UsageError for shares of another sum or world size.
  void set_shares(const std::vector<std::int64_t>& shares);
  std::int64_t num_batches() const;
  const DistributedSampler& sampler() const;
  const ImageDataset& dataset() const;

  // Builds batch `batch_index` of `epoch` directly (what the workers run).
  Batch make_batch(std::int64_t epoch, std::int64_t batch_index) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace partrain::data
