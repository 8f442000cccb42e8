#include "trainer/parallel/ddp_strategy.h"

#include <ATen/ATen.h>
#include <cstdint>
#include <torch/nn/module.h>

#include "comm_backends/communicator.h"
#include "common/errors.h"
#include "trainer/parallel/powersgd.h"
#include "trainer/parallel/reducer.h"
#include "trainer/parallel/strategy_state.h"
#include "trainer/parallel/tensor_buffer.h"
#include "trainer/precision/precision.h"
#include "trainer/report/report_format.h"

namespace partrain {

DdpStrategy::DdpStrategy(const Config& config, const c10::Device& device, comm::Communicator& comm)
    : Strategy(config, device, &comm) {}

DdpStrategy::~DdpStrategy() = default;

void DdpStrategy::make_optimizer(TrainModel& model) {
  optimizer_ = std::make_unique<ReplicatedOptimizer>(config_.train.optimizer, model.module());
}

void DdpStrategy::start_gradient_averaging(TrainModel& model) {
  ReducerOptions ro;
  ro.bucket_mb = config_.comm.bucket_mb;
  ro.timeout = config_.comm.timeout();
  const std::vector<at::Tensor> parameters = model.module().parameters();
  reducer_ = std::make_unique<Reducer>(parameters, *comm_, ro);
  if (gradient_scale_ > 0) reducer_->set_scale(gradient_scale_);
  if (config_.comm.compression == Compression::kPowerSgd && !parameters.empty()) {
    PowerSgdOptions po;
    po.rank = config_.comm.powersgd_rank;
    po.start_step = config_.comm.powersgd_start_step;
    po.seed = config_.seed;
    powersgd_ = std::make_unique<PowerSgd>(po, *comm_, reducer_->bucket_contents(),
                                           parameters.front().options());
    reducer_->use_reduction(*powersgd_);
    // A checkpoint without PowerSGD's state leaves it as it starts (its warm-up first).
    if (resumed_powersgd_) powersgd_->load(*resumed_powersgd_, resumed_from_);
  }
  resumed_powersgd_.reset();
}

void DdpStrategy::set_rank_share(std::int64_t share, std::int64_t micro_batch) {
  // Even shares take the Reducer's own 1.0f / W, so that an even run keeps its bits whatever
  // the size of M (share / M in f32 is exact only below 2^24).
  const int world = comm_->size();
  const bool even = share * world == micro_batch;
  share_of_samples_ = even ? 0.0 : static_cast<double>(share) / static_cast<double>(micro_batch);
  gradient_scale_ = even ? 1.0f / static_cast<float>(world) : static_cast<float>(share_of_samples_);
  if (reducer_) reducer_->set_scale(gradient_scale_);
}

void DdpStrategy::prepare_for_backward(bool sync) {
  if (reducer_) reducer_->prepare_for_backward(sync);
}

void DdpStrategy::finish_backward() {
  if (reducer_) reducer_->finish_backward();
}

// Every rank holds the same averaged gradients, so each clips by the same factor and the
// norm needs no collective; the loss scale's verdict is agreed all the same, as a safeguard
// that costs one small allreduce only under f16.
bool DdpStrategy::step(const UpdateOptions& options, PrecisionPlugin& precision) {
  const bool finite = unscale_and_agree(precision, optimizer_->gradients());
  if (finite) optimizer_->step(options.lr, options.clip_grad_norm);
  precision.update(finite);
  // The buckets are the .grad: zeroing them keeps every gradient in its slot.
  if (reducer_) {
    reducer_->zero_grad();
  } else {
    optimizer_->zero_grad();
  }
  return finite;
}

void DdpStrategy::share_buffers(TrainModel& model) {
  const std::vector<at::Tensor> buffers = model.module().buffers();
  // SyncBatchNorm's statistics are the same on every rank already.
  if (share_of_samples_ == 0 || config_.model.sync_batchnorm) {
    broadcast_from_rank0(buffers, *comm_);
    return;
  }
  // Uneven shares: each rank's running statistics count by its share of the samples (the
  // counters, such as num_batches_tracked, are the same on every rank and stay as they are).
  torch::NoGradGuard no_grad;
  for (const at::Tensor& b : buffers) {
    if (!at::isFloatingType(b.scalar_type())) continue;
    b.mul_(share_of_samples_);
    allreduce_tensor(*comm_, b, comm::ReduceOp::sum);
  }
}

void DdpStrategy::save_state(StrategyState& out, bool writer) {
  if (writer) out.entries.emplace_back("optimizer", optimizer_->save());
  // Every rank: PowerSGD's save gathers the ranks' error buffers.
  if (powersgd_) {
    c10::IValue powersgd = powersgd_->save();
    if (writer) out.entries.emplace_back("powersgd", std::move(powersgd));
  }
}

void DdpStrategy::load_state(const SavedStrategyState& saved) {
  optimizer_->load(saved_optimizer(saved));
  if (saved.checkpoint.contains("powersgd")) {
    resumed_powersgd_ = saved.checkpoint.at("powersgd");
    resumed_from_ = saved.path;
  }
}

// The PowerSGD state outlives the Reducer: the report still reads its byte counts.
void DdpStrategy::stop() { reducer_.reset(); }

double DdpStrategy::comm_wait_seconds() const {
  return reducer_ ? reducer_->comm_wait_seconds() : 0.0;
}

double DdpStrategy::comm_busy_seconds() { return reducer_ ? reducer_->comm_busy_seconds() : 0.0; }

std::int64_t DdpStrategy::comm_bytes() { return reducer_ ? reducer_->comm_bytes() : 0; }

std::int64_t DdpStrategy::comm_buckets() { return reducer_ ? reducer_->comm_buckets() : 0; }

const std::vector<BucketTiming>& DdpStrategy::bucket_timings() const {
  return reducer_ ? reducer_->bucket_timings() : Strategy::bucket_timings();
}

std::optional<CompressionRecord> DdpStrategy::compression() const {
  if (!powersgd_) return std::nullopt;
  return CompressionRecord{"powersgd",
                           config_.comm.powersgd_rank,
                           config_.comm.powersgd_start_step,
                           static_cast<std::int64_t>(powersgd_->compressed_matrices()),
                           static_cast<std::int64_t>(powersgd_->bytes_per_step()),
                           static_cast<std::int64_t>(powersgd_->uncompressed_bytes_per_step())};
}

StrategyMemory DdpStrategy::memory(const TrainModel& model) {
  StrategyMemory m = Strategy::memory(model);  // .grad: the Reducer's buckets
  m.optimizer_state = optimizer_->state_bytes();
  if (powersgd_) m.communication = powersgd_->memory_bytes();
  return m;
}

}  // namespace partrain
