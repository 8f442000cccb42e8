#include "trainer/parallel/single_strategy.h"

#include "common/errors.h"
#include "trainer/device/rank_device.h"
#include "trainer/parallel/data_parallel.h"
#include "trainer/parallel/strategy_state.h"
#include "trainer/precision/precision.h"

namespace partrain {

SingleStrategy::SingleStrategy(const Config& config, const c10::Device& device)
    : Strategy(config, device, nullptr) {}

SingleStrategy::~SingleStrategy() = default;

void SingleStrategy::make_optimizer(TrainModel& model) {
  optimizer_ = std::make_unique<ReplicatedOptimizer>(config_.train.optimizer, model.module());
}

bool SingleStrategy::step(const UpdateOptions& options, PrecisionPlugin& precision) {
  const bool finite = unscale_and_agree(precision, optimizer_->gradients());
  if (finite) optimizer_->step(options.lr, options.clip_grad_norm);
  precision.update(finite);
  optimizer_->zero_grad();
  return finite;
}

void SingleStrategy::save_state(StrategyState& out, bool writer) {
  if (writer) out.entries.emplace_back("optimizer", optimizer_->save());
}

void SingleStrategy::load_state(const SavedStrategyState& saved) {
  optimizer_->load(saved_optimizer(saved));
}

StrategyMemory SingleStrategy::memory(const TrainModel& model) {
  StrategyMemory m = Strategy::memory(model);
  m.optimizer_state = optimizer_->state_bytes();
  return m;
}

namespace {

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

DataParallelStrategy::DataParallelStrategy(const Config& config, const c10::Device& device)
    : SingleStrategy(config, device),
      devices_(data_parallel_devices(config)),
      weights_(data_parallel_weights(config, devices_.size())) {}

at::Tensor DataParallelStrategy::forward(TrainModel& model, const at::Tensor& images) const {
  if (devices_.empty()) return model.forward(images);
  return data_parallel_forward(model, images, devices_, device_, weights_);
}

std::vector<std::string> DataParallelStrategy::spread_devices() const {
  std::vector<std::string> names;
  for (const auto& d : devices_) names.push_back(d.str());
  return names;
}

}  // namespace partrain
