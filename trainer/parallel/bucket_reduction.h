// defines: BucketReduction — how the Reducer's communication thread reduces one gradient
// bucket over the ranks — its plain form AllreduceBucket, ReduceScatterBucket (train.shard
// gradients: only this rank's block of each sum is kept), and BucketContents, the layout of a
// bucket that a reduction may need (PowerSgd, powersgd.h, compresses each matrix of it).
#pragma once

#include <ATen/Tensor.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainer/parallel/tensor_buffer.h"

namespace partrain {

// The parameters of one bucket, in the order they lie in its flat tensor.
struct BucketContents {
  std::vector<std::int64_t> offsets;              // elements into the flat tensor
  std::vector<std::vector<std::int64_t>> shapes;  // each parameter's shape
};

class BucketReduction {
 public:
  virtual ~BucketReduction() = default;
  // On the communication thread, for every bucket of a sync step in bucket order, the same
  // order on every rank. `flat` holds this rank's gradients multiplied by `scale`; on return
  // it holds their sum over the ranks (or, compressed, an approximation of it), the same on
  // every rank. `order`: how a CUDA bucket meets the compute stream (allreduce_tensor()).
  // Returns the bytes this rank handed to its collectives for the bucket (report.json's
  // comm_bytes, from which `partrain explain` gives the achieved busbw).
  virtual std::int64_t reduce(std::size_t bucket, const at::Tensor& flat, float scale,
                              const StreamOrder& order) = 0;
  // On the training thread, once every bucket of a sync step is reduced.
  virtual void end_step() {}
};

// The bucket as it is, summed by one allreduce.
class AllreduceBucket final : public BucketReduction {
 public:
  explicit AllreduceBucket(comm::Communicator& comm) : comm_(comm) {}
  std::int64_t reduce(std::size_t, const at::Tensor& flat, float,
                      const StreamOrder& order) override {
    allreduce_tensor(comm_, flat, comm::ReduceOp::sum, order);
    return flat.numel() * static_cast<std::int64_t>(flat.element_size());
  }

 private:
  comm::Communicator& comm_;
};

// Sharded gradients (Note [Sharded gradients], reducer.cpp): bucket b's sum over the ranks is
// reduce-scattered and this rank's block of it added to shards[b], its gradient shard, which
// accumulates over the micro-steps of an optimizer step until the step zeroes it (and says so,
// shards_zeroed()). The first reduction into a zeroed shard writes the shard itself; only a
// later micro-step's needs a scratch block to add from, made the first time one does. The
// bucket itself is left as scratch.
class ReduceScatterBucket final : public BucketReduction {
 public:
  ReduceScatterBucket(comm::Communicator& comm, std::vector<at::Tensor> shards)
      : comm_(comm), shards_(std::move(shards)), zeroed_(shards_.size(), true) {}
  std::int64_t reduce(std::size_t bucket, const at::Tensor& flat, float,
                      const StreamOrder& order) override {
    const at::Tensor& shard = shards_.at(bucket);
    if (zeroed_[bucket]) {
      reduce_scatter_tensor(comm_, flat, shard, comm::ReduceOp::sum, order);
      zeroed_[bucket] = false;
    } else {
      if (!scratch_.defined()) {
        std::int64_t largest = 0;
        for (const at::Tensor& s : shards_) largest = std::max(largest, s.numel());
        scratch_ = shard.new_empty({largest});
      }
      const at::Tensor out = scratch_.narrow(0, 0, shard.numel());
      reduce_scatter_tensor(comm_, flat, out, comm::ReduceOp::sum, order);
      shard.add_(out);
    }
    return flat.numel() * static_cast<std::int64_t>(flat.element_size());
  }
  // On the training thread, with no reduction in flight: every shard is zero again.
  void shards_zeroed() { std::fill(zeroed_.begin(), zeroed_.end(), true); }
  // The scratch block, once a micro-step has needed it.
  std::int64_t scratch_bytes() const {
    return scratch_.defined() ? static_cast<std::int64_t>(scratch_.nbytes()) : 0;
  }

 private:
  comm::Communicator& comm_;
  std::vector<at::Tensor> shards_;
  std::vector<bool> zeroed_;  // per bucket: its shard holds nothing of this optimizer step yet
  at::Tensor scratch_;
};

}  // namespace partrain
