// defines: SingleStrategy (strategy single: one process, one device) and DataParallelStrategy
// (strategy dp: one process, each batch split over the GPUs it sees, Note [DataParallel]).
// Both hold the whole optimizer and step it on their own gradients.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trainer/optim/optimizer.h"
#include "trainer/parallel/strategy.h"

namespace partrain {

class SingleStrategy : public Strategy {
 public:
  SingleStrategy(const Config& config, const c10::Device& device);
  ~SingleStrategy() override;

  void make_optimizer(TrainModel& model) override;
  bool step(const UpdateOptions& options, PrecisionPlugin& precision) override;
  void save_state(StrategyState& out, bool writer) override;
  void load_state(const SavedStrategyState& saved) override;
  StrategyMemory memory(const TrainModel& model) override;

 protected:
  std::unique_ptr<ReplicatedOptimizer> optimizer_;
};

class DataParallelStrategy final : public SingleStrategy {
 public:
  // Throws UsageError when data.balance's weights are not one per visible GPU.
  DataParallelStrategy(const Config& config, const c10::Device& device);

  at::Tensor forward(TrainModel& model, const at::Tensor& images) const override;
  std::vector<std::string> spread_devices() const override;

 private:
  std::vector<c10::Device> devices_;
  std::vector<double> weights_;  // data.balance weights, one per device; empty: even
};

}  // namespace partrain
