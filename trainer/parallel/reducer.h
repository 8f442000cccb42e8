// defines: Reducer, ReducerOptions and GradientHome — DDP's gradient averaging: buckets,
// autograd hooks, a communication thread, and the wait before the optimizer step. See Note
// [Reducer] and Note [Sharded gradients] in reducer.cpp.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "comm_backends/cuda_stream.h"
#include "trainer/observe/phase_times.h"
#include "trainer/parallel/bucket_assignment.h"
#include "trainer/parallel/bucket_reduction.h"

namespace torch::autograd {
struct Node;
}

namespace partrain {

namespace comm {
class Communicator;
}
struct StreamOrder;

// Where the gradients live between backward and the optimizer step.
enum class GradientHome : std::uint8_t {
  // Each parameter's .grad is a view of its slot in a bucket that lives as long as the Reducer:
  // autograd accumulates into the bucket and the reduction averages it in place, so a gradient
  // is held once (train.shard none and optimizer).
  kBuckets,
  // No .grad is kept: each gradient is copied into its bucket and dropped, and the bucket's
  // reduction keeps only this rank's block of it (a BucketReduction such as
  // ReduceScatterBucket); on the CPU a bucket lives only from its first gradient to the end of
  // its reduction. Every backward communicates (train.shard gradients, Note [Sharded gradients]).
  kShards,
};

struct ReducerOptions {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;  // small, so the first allreduce starts early in backward
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Each bucket's length rounded up to a multiple of this (the world size when sharded, so that
  // every rank's block of a bucket is as long); the padding holds zeros.
  std::size_t pad_to = 1;
  GradientHome gradients = GradientHome::kBuckets;
};

class Reducer {
 public:
  Reducer(std::vector<at::Tensor> parameters, comm::Communicator& comm, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before backward. sync=false: a gradient-accumulation micro-step, no communication
  // (GradientHome::kShards communicates every micro-step: it first waits for the previous
  // micro-step's buckets, then reduces this one's).
  void prepare_for_backward(bool sync);
  // Call after backward of a sync step: waits for every bucket. Then, with kBuckets, each
  // parameter's .grad holds its averaged gradient; with kShards the reduction holds this rank's
  // block. Rethrows a communication failure.
  void finish_backward();
  // kBuckets: zeroes every bucket, so every .grad, after the optimizer step.
  void zero_grad();

  // What each rank's gradient is multiplied by before the sum over the ranks: its share of
  // the step's samples, b_r / M, so that the sum is the mean over all M samples when each
  // rank's loss is the mean over its own b_r. 1 / W until set (even shares). Call between
  // steps; the same bucket reduction (PowerSGD's too) receives it.
  void set_scale(float scale);
  float scale() const { return scale_; }

  // Replaces the plain allreduce of each bucket by `reduction` (PowerSGD), from the next sync
  // step on. It must outlive the Reducer. The same on every rank.
  void use_reduction(BucketReduction& reduction);
  std::vector<BucketContents> bucket_contents() const;  // each bucket's layout, in order
  // The parameters the Reducer averages (those that require a gradient), which the indices of
  // layout() refer to, and each bucket's layout, `elements` padded to ReducerOptions::pad_to.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  const std::vector<BucketLayout>& layout() const { return layout_; }
  // GradientHome::kBuckets: bucket b's flat tensor, whose slots are the parameters' .grad.
  const at::Tensor& bucket(std::size_t b) const { return buckets_.at(b).flat; }

  std::size_t bucket_count() const { return buckets_.size(); }
  std::vector<std::size_t> bucket_sizes() const;  // elements per bucket, in launch order
  // Bytes of the buckets now (the transient ones of kShards count while they live) and the
  // most they held at once so far.
  std::int64_t bucket_bytes();
  std::int64_t peak_bucket_bytes();
  double comm_wait_seconds() const { return comm_wait_seconds_; }  // blocked after backward
  double comm_busy_seconds();  // time the communication thread spent in allreduce
  // Bytes this rank handed to its gradient collectives so far, and how many buckets they were.
  std::int64_t comm_bytes();
  std::int64_t comm_buckets();
  // Per bucket, when its collective of the last sync step started and ended on the
  // communication thread. Read it after finish_backward() (which has seen every bucket done)
  // and before the next prepare_for_backward().
  const std::vector<BucketTiming>& bucket_timings() const { return timings_; }

 private:
  struct Slot {
    std::size_t bucket = 0;
    std::size_t offset = 0;  // elements into the bucket
    bool ready = false;
  };
  struct Bucket {
    at::Tensor flat;  // undefined while a transient bucket is not in use
    std::vector<std::size_t> params;
    std::size_t elements = 0;  // padded
    std::size_t pending = 0;
  };

  // The constructor's steps, in order.
  void make_buckets();
  void register_hooks();
  void prepare_cuda_staging();

  // A slot of bucket `b` as a tensor of parameter k's shape (set_ over the bucket's storage:
  // not an autograd view, so it may serve as .grad).
  at::Tensor slot_view(std::size_t k) const;
  at::Tensor& flat_of(std::size_t bucket);  // allocates a transient bucket; caller holds mutex_
  void wait_for_room(std::unique_lock<std::mutex>& lock);
  // Sharded gradients on the CPU: buckets alive before backward waits for the wire. With one,
  // backward computes the next gradient while a bucket is on the wire and then waits for it,
  // so at most the bucket on the wire and that gradient are alive (bench/ddp/shard.sh).
  static constexpr int kMaxLiveBuckets = 1;
  void on_gradient(std::size_t param);
  void mark_bucket_ready(std::size_t bucket);  // caller holds mutex_
  void run_comm_thread();
  // The one collective, timed; returns the bytes handed to it.
  std::int64_t reduce_bucket(std::size_t bucket, const StreamOrder& order);
  std::string describe_bucket(std::size_t bucket) const;

  std::vector<at::Tensor> params_;
  comm::Communicator& comm_;
  ReducerOptions options_;
  bool transient_ = false;  // kShards on the CPU: buckets allocated per step, freed after
  std::vector<Slot> slots_;
  std::vector<BucketLayout> layout_;
  std::vector<Bucket> buckets_;
  // Each parameter's gradient accumulator (held, so that autograd keeps using the one the hook
  // is on) and the hook's key, removed on destruction.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hooks_;
  std::vector<bool> ready_;            // per bucket: all its gradients are in
  std::vector<BucketTiming> timings_;  // per bucket; written by the communication thread
  // CUDA only: per bucket, the point on the compute stream where its gradients are written
  // (see Note [Reducer streams]); and the pinned memory and copy stream of the host backends.
  std::vector<comm::CudaEvent> ready_events_;
  std::unique_ptr<comm::HostStaging> staging_;
  AllreduceBucket plain_reduction_;
  BucketReduction* reduction_ = &plain_reduction_;  // the one call site: run_comm_thread()
  std::size_t next_ = 0;  // next bucket the comm thread reduces; == size: idle
  bool in_step_ = false;  // a communicating step began and finish_backward() has not ended it
  float scale_ = 1.0f;
  std::int64_t live_ = 0;  // bytes of the buckets alive now
  std::int64_t peak_live_ = 0;
  int live_buckets_ = 0;  // transient ones

  std::mutex mutex_;
  std::condition_variable cv_;
  bool sync_ = false;
  bool stop_ = false;
  bool comm_thread_ended_ = false;  // run_comm_thread() returned
  std::exception_ptr error_;
  double comm_busy_seconds_ = 0;
  double comm_wait_seconds_ = 0;
  std::int64_t comm_bytes_ = 0;
  std::int64_t comm_buckets_ = 0;
  std::thread comm_thread_;
};

// A tensor of shape `sizes` over `flat`'s memory from element `offset` on: it shares the
// memory but is not an autograd view of `flat`, so it can be a parameter's data or its .grad.
at::Tensor storage_view(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes);

// Broadcasts every parameter and buffer from rank 0 so all ranks start identical.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm);

}  // namespace partrain
