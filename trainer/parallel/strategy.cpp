#include "trainer/parallel/strategy.h"

#include <torch/nn/module.h>
#include <torch/utils.h>

#include "comm_backends/communicator.h"
#include "common/errors.h"
#include "trainer/device/rank_device.h"
#include "trainer/parallel/powersgd.h"
#include "trainer/parallel/reducer.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {
namespace {

std::vector<at::Tensor> state_tensors(const torch::nn::Module& model) {
  std::vector<at::Tensor> tensors = model.parameters();
  for (const auto& b : model.buffers()) tensors.push_back(b);
  return tensors;
}

// data.balance's weights under strategy dp size each device's piece of the batch: one per
// device (the count is known only here, where the devices are).
std::vector<double> data_parallel_weights(const Config& config, std::size_t devices) {
  const DataConfig& d = config.data;
  if (devices == 0 || d.balance != BalanceMode::kWeights) return {};
  PARTRAIN_CHECK(d.balance_weights.size() == devices, UsageError, d.balance_at,
                 ": data.balance: ", d.balance_weights.size(),
                 d.balance_weights.size() == 1 ? " weight" : " weights", " for the ", devices,
                 " devices of strategy dp; give one per device");
  return d.balance_weights;
}

}  // namespace

Strategy::Strategy(const Config& config, const c10::Device& device, comm::Communicator* comm)
    : config_(config),
      device_(device),
      comm_(comm),
      dp_devices_(data_parallel_devices(config)),
      dp_weights_(data_parallel_weights(config, dp_devices_.size())) {}

Strategy::~Strategy() = default;

std::unique_ptr<TrainModel> Strategy::build_model(const ModelShape& shape,
                                                  comm::Communicator* batchnorm_comm) const {
  torch::manual_seed(config_.seed);
  std::unique_ptr<TrainModel> model = make_train_model(config_.model, shape, batchnorm_comm);
  // Layers that need the communicator (such as a BatchNorm whose statistics are reduced over
  // the ranks) replace their plain forms here: the communicator exists, and the broadcast
  // below still reaches what they hold.
  model->module().to(device_);
  if (comm_ != nullptr) broadcast_from_rank0(state_tensors(model->module()), *comm_);
  return model;
}

void Strategy::start_gradient_averaging(TrainModel& model) {
  if (comm_ == nullptr) return;
  ReducerOptions ro;
  ro.bucket_mb = config_.comm.bucket_mb;
  ro.timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.comm.timeout_s * 1000));
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
  }
}

void Strategy::set_rank_share(std::int64_t share, std::int64_t micro_batch) {
  if (comm_ == nullptr) return;
  // Even shares take the Reducer's own 1.0f / W, so that an even run keeps its bits whatever
  // the size of M (share / M in f32 is exact only below 2^24).
  const int world = comm_->size();
  const bool even = share * world == micro_batch;
  share_of_samples_ = even ? 0.0 : static_cast<double>(share) / static_cast<double>(micro_batch);
  gradient_scale_ = even ? 1.0f / static_cast<float>(world) : static_cast<float>(share_of_samples_);
  if (reducer_) reducer_->set_scale(gradient_scale_);
}

CheckpointState* Strategy::checkpoint_state() const { return powersgd_.get(); }

at::Tensor Strategy::forward(TrainModel& model, const at::Tensor& images) const {
  if (dp_devices_.empty()) return model.forward(images);
  return model.forward_data_parallel(images, dp_devices_, device_, dp_weights_);
}

void Strategy::prepare_for_backward(bool sync) {
  if (reducer_) reducer_->prepare_for_backward(sync);
}

void Strategy::finish_backward() {
  if (reducer_) reducer_->finish_backward();
}

void Strategy::share_buffers(TrainModel& model) {
  if (comm_ == nullptr) return;
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

// The PowerSGD state outlives the Reducer: the report still reads its byte counts.
void Strategy::stop() { reducer_.reset(); }

double Strategy::comm_wait_seconds() const {
  return reducer_ ? reducer_->comm_wait_seconds() : 0.0;
}

double Strategy::comm_busy_seconds() { return reducer_ ? reducer_->comm_busy_seconds() : 0.0; }

std::int64_t Strategy::comm_bytes() { return reducer_ ? reducer_->comm_bytes() : 0; }

std::int64_t Strategy::comm_buckets() { return reducer_ ? reducer_->comm_buckets() : 0; }

const std::vector<BucketTiming>& Strategy::bucket_timings() const {
  static const std::vector<BucketTiming> kNone;
  return reducer_ ? reducer_->bucket_timings() : kNone;
}

}  // namespace partrain
