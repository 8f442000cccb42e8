// defines: Reducer — DDP's gradient averaging: buckets, autograd hooks, a communication
// thread, and the wait before the optimizer step. See Note [Reducer] in reducer.cpp.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include "comm_backends/cuda_stream.h"
#include "trainer/parallel/bucket_reduction.h"
#include "trainer/observe/phase_times.h"

namespace partrain {

namespace comm {
class Communicator;
}
struct StreamOrder;

struct ReducerOptions {
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;  // small, so the first allreduce starts early in backward
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

class Reducer {
 public:
  Reducer(std::vector<at::Tensor> parameters, comm::Communicator& comm, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Call before backward. sync=false: a gradient-accumulation micro-step, no communication.
  void prepare_for_backward(bool sync);
  // Call after backward of a sync step: waits for every bucket, then writes the averaged
  // gradients into each parameter's .grad. Rethrows a communication failure.
  void finish_backward();

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

  std::size_t bucket_count() const { return buckets_.size(); }
  std::vector<std::size_t> bucket_sizes() const;  // elements per bucket, in launch order
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
    at::Tensor flat;
    std::vector<std::size_t> params;
    std::size_t pending = 0;
  };

  // The constructor's steps, in order.
  void make_buckets();
  void register_hooks();
  void prepare_cuda_staging();

  void on_gradient(std::size_t param, const at::Tensor& grad);
  void mark_bucket_ready(std::size_t bucket);  // caller holds mutex_
  void run_comm_thread();
  // The one collective, timed; returns the bytes handed to it.
  std::int64_t reduce_bucket(std::size_t bucket, const StreamOrder& order);
  std::string describe_bucket(std::size_t bucket) const;

  std::vector<at::Tensor> params_;
  comm::Communicator& comm_;
  ReducerOptions options_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<unsigned> hooks_;        // hook handles, removed on destruction
  std::vector<bool> ready_;            // per bucket: all its gradients are in
  std::vector<BucketTiming> timings_;  // per bucket; written by the communication thread
  // CUDA only: per bucket, the point on the compute stream where its gradients are written
  // (see Note [Reducer streams]); and the pinned memory and copy stream of the host backends.
  std::vector<comm::CudaEvent> ready_events_;
  std::unique_ptr<comm::HostStaging> staging_;
  AllreduceBucket plain_reduction_;
  BucketReduction* reduction_ = &plain_reduction_;  // the one call site: run_comm_thread()
  std::size_t next_ = 0;  // next bucket the comm thread reduces; == size: idle
  float scale_ = 1.0f;

  std::mutex mutex_;
  std::condition_variable cv_;
  bool sync_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  double comm_busy_seconds_ = 0;
  double comm_wait_seconds_ = 0;
  std::int64_t comm_bytes_ = 0;
  std::int64_t comm_buckets_ = 0;
  std::thread comm_thread_;
};

// Broadcasts every parameter and buffer from rank 0 so all ranks start identical.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm);

}  // namespace partrain
