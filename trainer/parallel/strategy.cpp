#include "trainer/parallel/strategy.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <set>

#include "comm_backends/communicator.h"
#include "common/errors.h"
#include "trainer/parallel/ddp_strategy.h"
#include "trainer/parallel/reducer.h"
#include "trainer/parallel/sharded_strategy.h"
#include "trainer/parallel/single_strategy.h"
#include "trainer/parallel/sync_batchnorm.h"
#include "trainer/parallel/tensor_buffer.h"
#include "trainer/precision/precision.h"
#include "trainer/report/report_format.h"

namespace partrain {

Strategy::Strategy(const Config& config, const c10::Device& device, comm::Communicator* comm)
    : config_(config), device_(device), comm_(comm) {}

Strategy::~Strategy() = default;

std::unique_ptr<TrainModel> Strategy::build_model(const ModelShape& shape,
                                                  comm::Communicator* batchnorm_comm) const {
  torch::manual_seed(config_.seed);
  // Layers that need the communicator (a BatchNorm whose statistics are reduced over the
  // ranks) replace their plain forms here: the communicator exists, and the broadcast below
  // still reaches what they hold.
  std::unique_ptr<TrainModel> model = make_train_model(
      config_.model, shape,
      batchnorm_comm != nullptr ? sync_batchnorm_layers(*batchnorm_comm) : NormLayer());
  model->module().to(device_);
  if (comm_ != nullptr) {
    std::vector<at::Tensor> tensors = model->module().parameters();
    for (const auto& b : model->module().buffers()) tensors.push_back(b);
    broadcast_from_rank0(tensors, *comm_);
  }
  return model;
}

void Strategy::start_gradient_averaging(TrainModel&) {}
void Strategy::set_rank_share(std::int64_t, std::int64_t) {}

at::Tensor Strategy::forward(TrainModel& model, const at::Tensor& images) const {
  return model.forward(images);
}

void Strategy::prepare_for_backward(bool) {}
void Strategy::finish_backward() {}
void Strategy::share_buffers(TrainModel&) {}
void Strategy::stop() {}
double Strategy::comm_wait_seconds() const { return 0.0; }
double Strategy::comm_busy_seconds() { return 0.0; }
std::int64_t Strategy::comm_bytes() { return 0; }
std::int64_t Strategy::comm_buckets() { return 0; }

const std::vector<BucketTiming>& Strategy::bucket_timings() const {
  static const std::vector<BucketTiming> kNone;
  return kNone;
}

std::vector<std::string> Strategy::spread_devices() const { return {}; }

namespace {

// Bytes of the storages under `tensors`, each storage once (views of one bucket count once).
std::int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  std::int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().data()).second)
      bytes += static_cast<std::int64_t>(t.storage().nbytes());
  }
  return bytes;
}

}  // namespace

StrategyMemory Strategy::memory(const TrainModel& model) {
  StrategyMemory m;
  const std::vector<at::Tensor> parameters = model.module().parameters();
  std::vector<at::Tensor> gradients;
  for (const at::Tensor& p : parameters) gradients.push_back(p.grad());
  m.parameters = storage_bytes(parameters);
  m.gradients = storage_bytes(gradients);
  return m;
}
std::optional<CompressionRecord> Strategy::compression() const { return std::nullopt; }

bool Strategy::unscale_and_agree(PrecisionPlugin& precision,
                                 const std::vector<at::Tensor>& gradients) {
  if (!precision.loss_scaling()) return true;
  at::Tensor found_inf = precision.unscale_and_find_inf(gradients);
  if (comm_ != nullptr && comm_->size() > 1) {
    allreduce_tensor(*comm_, found_inf, comm::ReduceOp::max);
  }
  return found_inf.cpu().item<float>() == 0.0f;
}

std::unique_ptr<Strategy> make_strategy(const Config& config, const c10::Device& device,
                                        comm::Communicator* comm) {
  switch (config.strategy) {
    case StrategyKind::kSingle:
      return std::make_unique<SingleStrategy>(config, device);
    case StrategyKind::kDp:
      return std::make_unique<DataParallelStrategy>(config, device);
    case StrategyKind::kDdp:
      PARTRAIN_CHECK(comm != nullptr, Error, "strategy ddp without a communicator");
      if (config.train.shard != Shard::kNone) {
        return std::make_unique<ShardedDdpStrategy>(config, device, *comm);
      }
      return std::make_unique<DdpStrategy>(config, device, *comm);
  }
  throw Error("make_strategy: a strategy partrain does not know");
}

}  // namespace partrain
