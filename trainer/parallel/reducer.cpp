// Note [Reducer]
// --------------
// DDP averages gradients over ranks while backward is still running, so communication
// hides behind computation. The parameters are laid, in reverse registration order (roughly
// the order autograd produces their gradients), into flat buckets (assign_buckets()):
//
//   bucket 0 (<= first_bucket_mb)  bucket 1 (<= bucket_mb)           ...
//   [ fc.w | fc.b ]                [ conv4.w | bn4.w | bn4.b | ... ]
//
// Each parameter's .grad is its slot of a bucket (a tensor over the bucket's memory), so a
// gradient is held once: autograd accumulates into the bucket itself. A hook runs after
// autograd has accumulated a parameter's gradient (a post-hook of its gradient accumulator);
// it scales the slot by the rank's share of the step's samples (1/W when the shares are even;
// set_scale()), and when a bucket's last slot is scaled the bucket is ready. A communication
// thread allreduces ready buckets strictly in bucket order — every rank issues the same
// collectives in the same order, whatever order autograd happened to finish them in — so
// bucket 0 is on the wire while autograd computes the gradients of bucket 1. After backward,
// finish_backward() waits for the remaining buckets; the averages are then in .grad already.
//
// What "allreduces a bucket" means is one pluggable piece, a BucketReduction: a plain
// allreduce of the flat tensor, or PowerSGD (powersgd.h), which sends low-rank factors of the
// bucket's matrices instead. It is called at one place, the communication thread's loop.
//
// Gradient accumulation: on a micro-step without sync the hooks do nothing and autograd
// sums into .grad, the bucket, as usual; on the sync step the hook scales the whole
// accumulated sum. Parameters that received no gradient this step contribute their .grad
// (zero unless accumulated) when finish_backward() closes the step. The optimizer step is
// followed by zero_grad(), which zeroes the buckets.
//
// Note [Sharded gradients]
// ------------------------
// With train.shard gradients (GradientHome::kShards) a rank keeps only its block of each
// bucket's sum (ZeRO-2): buckets are padded to a multiple of W, and rank r's block is the r-th
// W-th of each. No .grad is kept: the hook copies the gradient autograd just produced into its
// slot, scaled, and drops .grad. On the CPU a bucket is allocated when its first gradient
// arrives and freed once its reduction (ReduceScatterBucket: reduce-scatter, this rank's block
// added to its gradient shard) is done, so only the buckets between backward and the wire
// are alive at once, never the whole gradient. Since nothing is kept between micro-steps,
// every backward communicates, gradient accumulation included: a micro-step's buckets are
// waited for when the next micro-step begins, behind its forward.
//
// Note [Reducer streams]
// ----------------------
// On CUDA the hooks write buckets on the compute stream (the legacy default stream, where
// LibTorch computes unless told otherwise), and the host cannot see when those writes land.
// So when a bucket's last slot is written, the hook records an event on the compute stream,
// and the collective orders itself after that event alone:
//
//   compute stream: ..grads of bucket 0.. [ev0] ..grads of bucket 1.. [ev1] ..rest of backward..
//   comm stream:                           wait ev0, allreduce 0     wait ev1, allreduce 1
//
// nccl runs the allreduce on its own non-blocking stream; the host backends copy the bucket
// to pinned host memory on a copy stream of their own (HostStaging), reduce it there and
// copy it back the same way. Neither waits for the rest of backward, and the compute stream
// never waits for them. The comm thread sees each collective finish (it polls an event,
// bounded by the communication timeout), so once finish_backward() has seen every bucket
// done, the copies into .grad that it queues on the compute stream, and the optimizer step
// after them, read reduced values.
#include "trainer/parallel/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "comm_backends/communicator.h"
#include "common/errors.h"
#include "common/stopwatch.h"
#include "trainer/observe/flight_recorder.h"
#include "trainer/parallel/bucket_assignment.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {

Reducer::Reducer(std::vector<at::Tensor> parameters, comm::Communicator& comm,
                 ReducerOptions options)
    : comm_(comm), options_(options), plain_reduction_(comm) {
  for (auto& p : parameters) {
    if (p.requires_grad()) params_.push_back(p);
  }
  scale_ = 1.0f / static_cast<float>(comm_.size());
  transient_ =
      options_.gradients == GradientHome::kShards && !params_.empty() && !params_[0].is_cuda();
  make_buckets();
  register_hooks();
  prepare_cuda_staging();
  next_ = buckets_.size();  // idle until the first sync step
  comm_thread_ = std::thread([this] { run_comm_thread(); });
}

// The layout is assign_buckets()'s, each bucket padded to pad_to; here each bucket gets its
// flat tensor (unless transient) and each parameter its slot in one, which is its .grad with
// GradientHome::kBuckets.
void Reducer::make_buckets() {
  std::vector<std::size_t> element_counts;
  for (const auto& p : params_) {
    PARTRAIN_CHECK(p.scalar_type() == params_[0].scalar_type() && p.device() == params_[0].device(),
                   Error, "DDP needs all parameters on one device with one dtype");
    element_counts.push_back(static_cast<std::size_t>(p.numel()));
  }
  const std::size_t element_bytes = params_.empty() ? 4 : params_[0].element_size();
  const std::size_t pad = std::max<std::size_t>(1, options_.pad_to);
  slots_.resize(params_.size());
  layout_ =
      assign_buckets(element_counts, element_bytes, {options_.bucket_mb, options_.first_bucket_mb});
  for (auto& layout : layout_) {
    layout.elements = (layout.elements + pad - 1) / pad * pad;
    for (std::size_t i = 0; i < layout.params.size(); ++i) {
      slots_[layout.params[i]].bucket = buckets_.size();
      slots_[layout.params[i]].offset = layout.offsets[i];
    }
    Bucket bucket;
    bucket.params = layout.params;
    bucket.elements = layout.elements;
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(buckets_.size(), false);
  timings_.resize(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    timings_[b].bytes = buckets_[b].elements * element_bytes;
    if (!transient_) flat_of(b);
  }
  if (options_.gradients != GradientHome::kBuckets) return;
  at::NoGradGuard no_grad;
  for (std::size_t k = 0; k < params_.size(); ++k) {
    at::Tensor view = slot_view(k);
    at::Tensor& grad = params_[k].mutable_grad();
    if (grad.defined()) view.copy_(grad);
    grad = view;
  }
}

at::Tensor& Reducer::flat_of(std::size_t b) {
  Bucket& bucket = buckets_[b];
  if (!bucket.flat.defined()) {
    const at::TensorOptions options = params_[0].options().requires_grad(false);
    bucket.flat = transient_ ? at::empty({static_cast<int64_t>(bucket.elements)}, options)
                             : at::zeros({static_cast<int64_t>(bucket.elements)}, options);
    if (transient_) {
      // The padding after the last slot is never written: it must add nothing.
      const std::size_t used =
          layout_[b].offsets.empty()
              ? 0
              : layout_[b].offsets.back() +
                    static_cast<std::size_t>(params_[layout_[b].params.back()].numel());
      bucket.flat
          .narrow(0, static_cast<int64_t>(used), static_cast<int64_t>(bucket.elements - used))
          .zero_();
    }
    live_ += static_cast<std::int64_t>(bucket.flat.nbytes());
    peak_live_ = std::max(peak_live_, live_);
    if (transient_) ++live_buckets_;
  }
  return bucket.flat;
}

at::Tensor Reducer::slot_view(std::size_t k) const {
  return storage_view(buckets_[slots_[k].bucket].flat, static_cast<std::int64_t>(slots_[k].offset),
                      params_[k].sizes());
}

at::Tensor storage_view(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes) {
  at::Tensor view = at::empty({0}, flat.options());
  view.set_(flat.storage(), flat.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
  return view;
}

void Reducer::register_hooks() {
  for (std::size_t k = 0; k < params_.size(); ++k) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(params_[k]);
    hooks_.push_back(
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, k](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              on_gradient(k);
              return outputs;
            })));
    accumulators_.push_back(std::move(accumulator));
  }
}

// The events and host staging of Note [Reducer streams]. A build without the CUDA runtime in
// partrain_comm keeps the plain path: the collective then waits for the whole compute stream,
// which is slower but still correct.
void Reducer::prepare_cuda_staging() {
  if (params_.empty() || !params_[0].is_cuda() || !comm::cuda_runtime_compiled_in()) return;
  const int device = params_[0].get_device();
  for (std::size_t b = 0; b < buckets_.size(); ++b) ready_events_.emplace_back(device);
  if (collective_reads_device_memory(comm_)) return;
  staging_ = std::make_unique<comm::HostStaging>(device, options_.timeout);
  // Pinned memory for the largest bucket now: allocating it may synchronise with the
  // device, which must not happen in the middle of backward.
  const Bucket* largest = &buckets_[0];
  for (const auto& b : buckets_) {
    if (b.elements > largest->elements) largest = &b;
  }
  staging_->host_buffer(as_buffer(largest->flat), 0);
}

Reducer::~Reducer() {
  if (comm_thread_.joinable()) {
    std::unique_lock<std::mutex> lock(mutex_);
    stop_ = true;
    cv_.notify_all();
    // A bucket's collective in flight ends within the communicator's timeout. One that has not
    // ended after it and a margin never will (its communicator does not honour its bound, as
    // finish_backward() found): joining would hold this rank for good, with its heartbeat
    // still beating, so it stops here, saying why.
    const auto bound = options_.timeout + std::chrono::seconds(5);
    if (!cv_.wait_for(lock, bound, [&] { return comm_thread_ended_; })) {
      std::fprintf(stderr,
                   "partrain: the gradient communication thread is still inside a collective "
                   "%lld ms after it was asked to stop (the communicator ignores its timeout); "
                   "exiting\n",
                   static_cast<long long>(bound.count()));
      std::fflush(stderr);
      std::_Exit(1);
    }
    lock.unlock();
    comm_thread_.join();
  }
  for (std::size_t k = 0; k < accumulators_.size(); ++k) {
    accumulators_[k]->del_post_hook(hooks_[k]);
  }
}

void Reducer::set_scale(float scale) {
  std::lock_guard<std::mutex> lock(mutex_);
  PARTRAIN_CHECK(next_ == buckets_.size(), Error, "Reducer: scale changed during a step");
  PARTRAIN_CHECK(scale > 0 && scale <= 1, Error, "Reducer: scale ", scale, " is outside (0, 1]");
  scale_ = scale;
}

void Reducer::use_reduction(BucketReduction& reduction) {
  std::lock_guard<std::mutex> lock(mutex_);
  PARTRAIN_CHECK(next_ == buckets_.size(), Error, "Reducer: reduction changed during a step");
  reduction_ = &reduction;
}

std::vector<BucketContents> Reducer::bucket_contents() const {
  std::vector<BucketContents> out(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (std::size_t k : buckets_[b].params) {
      out[b].offsets.push_back(static_cast<std::int64_t>(slots_[k].offset));
      out[b].shapes.push_back(params_[k].sizes().vec());
    }
  }
  return out;
}

std::vector<std::size_t> Reducer::bucket_sizes() const {
  std::vector<std::size_t> sizes;
  for (const auto& b : buckets_) sizes.push_back(b.elements);
  return sizes;
}

double Reducer::comm_busy_seconds() {
  std::lock_guard<std::mutex> lock(mutex_);
  return comm_busy_seconds_;
}

std::int64_t Reducer::comm_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return comm_bytes_;
}

std::int64_t Reducer::comm_buckets() {
  std::lock_guard<std::mutex> lock(mutex_);
  return comm_buckets_;
}

std::int64_t Reducer::bucket_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

std::int64_t Reducer::peak_bucket_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_live_;
}

// Sharded gradients on the CPU: backward may run ahead of the wire, and every bucket it fills
// meanwhile is memory; so before another bucket is begun, while kMaxLiveBuckets are alive and
// the oldest of them is on the wire (ready, so the communication thread is at it), autograd
// waits for it to go (bounded by comm.timeout_s, after which it goes on regardless). It never
// waits for a bucket that is not ready: that one may need a gradient autograd has yet to
// compute.
void Reducer::wait_for_room(std::unique_lock<std::mutex>& lock) {
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  cv_.wait_until(lock, deadline, [&] {
    return live_buckets_ < kMaxLiveBuckets || stop_ || next_ >= buckets_.size() || !ready_[next_];
  });
}

void Reducer::prepare_for_backward(bool sync) {
  // Sharded gradients communicate every micro-step; the previous one's buckets are waited for
  // here, after this micro-step's forward.
  if (options_.gradients == GradientHome::kShards) {
    if (in_step_) finish_backward();
    sync = true;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  PARTRAIN_CHECK(next_ == buckets_.size() && !in_step_, Error,
                 "Reducer: previous step did not finish");
  sync_ = sync;
  if (!sync) return;
  for (auto& s : slots_) s.ready = false;
  for (auto& b : buckets_) b.pending = b.params.size();
  std::fill(ready_.begin(), ready_.end(), false);
  next_ = 0;
  in_step_ = true;
  error_ = nullptr;
}

void Reducer::on_gradient(std::size_t k) {
  if (!sync_) return;
  Slot& slot = slots_[k];
  at::NoGradGuard no_grad;
  at::Tensor& grad = params_[k].mutable_grad();
  const int64_t n = params_[k].numel();
  at::Tensor flat;
  {
    // A leaf's hook runs once per backward; the check keeps a bucket already on the wire
    // from being written should that ever not hold.
    std::unique_lock<std::mutex> lock(mutex_);
    if (slot.ready) return;
    if (transient_) {
      wait_for_room(lock);
      // A bucket of this one gradient alone, unpadded, is the gradient itself: no copy.
      Bucket& bucket = buckets_[slot.bucket];
      if (!bucket.flat.defined() && bucket.params.size() == 1 &&
          bucket.elements == static_cast<std::size_t>(n) && grad.defined() &&
          grad.is_contiguous()) {
        bucket.flat = grad.reshape(-1);
        grad.reset();
        bucket.flat.mul_(scale_);
        live_ += static_cast<std::int64_t>(bucket.flat.nbytes());
        peak_live_ = std::max(peak_live_, live_);
        ++live_buckets_;
        slot.ready = true;
        if (--bucket.pending == 0) mark_bucket_ready(slot.bucket);
        return;
      }
    }
    flat = flat_of(slot.bucket);
  }
  auto view = flat.narrow(0, static_cast<int64_t>(slot.offset), n);
  if (options_.gradients == GradientHome::kShards) {
    at::mul_out(view, grad.reshape(-1), at::scalar_tensor(scale_, grad.options()));
    grad.reset();
  } else {
    // .grad is the slot unless something replaced it (then its values move into the slot,
    // which becomes .grad again).
    if (!grad.defined() || grad.data_ptr() != view.data_ptr()) {
      if (grad.defined()) view.copy_(grad.reshape(-1));
      grad = slot_view(k);
    }
    view.mul_(scale_);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  slot.ready = true;
  if (--buckets_[slot.bucket].pending == 0) mark_bucket_ready(slot.bucket);
}

void Reducer::mark_bucket_ready(std::size_t b) {
  // Every write into the bucket was queued before this, on the stream it is recorded on.
  if (!ready_events_.empty()) ready_events_[b].record(nullptr);
  ready_[b] = true;
  cv_.notify_all();
}

std::string Reducer::describe_bucket(std::size_t b) const {
  return detail::concat("gradient bucket ", b, " of ", buckets_.size(), " (", buckets_[b].elements,
                        " elements)");
}

void Reducer::run_comm_thread() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (next_ < buckets_.size() && ready_[next_]); });
    if (stop_) {
      comm_thread_ended_ = true;
      cv_.notify_all();
      return;
    }
    std::size_t b = next_;
    lock.unlock();
    auto start = Clock::now();
    std::exception_ptr error;
    std::int64_t bytes = 0;
    StreamOrder order;
    if (!ready_events_.empty()) {
      order.ready = &ready_events_[b];
      order.staging = staging_.get();
    }
    try {
      bytes = reduce_bucket(b, order);
    } catch (const PeerError& e) {
      error =
          std::make_exception_ptr(PeerError(e.peer_rank(), describe_bucket(b) + ": " + e.what()));
    } catch (const CommError& e) {
      error = std::make_exception_ptr(CommError(describe_bucket(b) + ": " + e.what()));
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    comm_busy_seconds_ += seconds_since(start);
    if (transient_ && buckets_[b].flat.defined()) {
      live_ -= static_cast<std::int64_t>(buckets_[b].flat.nbytes());
      --live_buckets_;
      buckets_[b].flat = at::Tensor();  // its block is in the gradient shard now
    }
    if (error) {
      error_ = error;
      next_ = buckets_.size();  // abandon the step; finish_backward() rethrows
    } else {
      comm_bytes_ += bytes;
      ++comm_buckets_;
      ++next_;
    }
    cv_.notify_all();
  }
}

// The start is the rank's arrival at this bucket's collective (trainer/observe): the others'
// waits for the last arrival show up as longer spans on their side. The end is when the sum is
// in the bucket (on CUDA, allreduce_tensor has seen the collective's event complete), so no
// device synchronisation is added here.
// The flight recorder keeps the last collectives for a failed run's dump: a bucket that
// throws or hangs stays entered, not left.
std::int64_t Reducer::reduce_bucket(std::size_t b, const StreamOrder& order) {
  const std::uint64_t seq =
      flight_recorder().enter(FlightOp::kAllreduce, static_cast<int>(b), timings_[b].bytes);
  timings_[b].start = Clock::now();
  const std::int64_t bytes = reduction_->reduce(b, buckets_[b].flat, scale_, order);
  timings_[b].end = Clock::now();
  flight_recorder().leave(seq);
  return bytes;
}

void Reducer::finish_backward() {
  auto start = Clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    PARTRAIN_CHECK(in_step_, Error, "Reducer: finish_backward() without a communicating step");
    // Parameters autograd did not reach this step still take part, so that every rank
    // reduces the same buckets.
    at::NoGradGuard no_grad;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      Slot& slot = slots_[k];
      if (slot.ready) continue;
      at::Tensor& flat = flat_of(slot.bucket);
      auto view = flat.narrow(0, static_cast<int64_t>(slot.offset), params_[k].numel());
      at::Tensor& g = params_[k].mutable_grad();
      if (options_.gradients == GradientHome::kShards) {
        if (g.defined()) {
          at::mul_out(view, g.reshape(-1), at::scalar_tensor(scale_, g.options()));
          g.reset();
        } else {
          view.zero_();
        }
      } else {
        if (g.defined() && g.data_ptr() != view.data_ptr()) view.copy_(g.reshape(-1));
        if (!g.defined() || g.data_ptr() != view.data_ptr()) g = slot_view(k);
        view.mul_(scale_);
      }
      slot.ready = true;
      if (--buckets_[slot.bucket].pending == 0) mark_bucket_ready(slot.bucket);
    }
    // The communicator bounds each collective by its own timeout; this bound only guards
    // against a communicator that fails to honour it.
    auto bound = options_.timeout * static_cast<int>(buckets_.size() + 1) + std::chrono::seconds(5);
    bool finished = cv_.wait_for(lock, bound, [&] { return next_ == buckets_.size(); });
    if (!finished) {
      throw CommError("gradient allreduce did not finish within the communication timeout; " +
                      describe_bucket(next_) + " was still in flight");
    }
    in_step_ = false;
    if (error_) std::rethrow_exception(error_);
  }
  reduction_->end_step();
  comm_wait_seconds_ += seconds_since(start);
}

void Reducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& b : buckets_) {
    if (b.flat.defined()) b.flat.zero_();
  }
}

void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, comm::Communicator& comm) {
  for (const auto& t : tensors) {
    at::NoGradGuard no_grad;
    auto contiguous = t.contiguous();
    broadcast_tensor(comm, contiguous, 0);
    if (!contiguous.is_same(t)) t.copy_(contiguous);
  }
}

}  // namespace partrain
