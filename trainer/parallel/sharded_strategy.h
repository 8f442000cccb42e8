// defines: ShardedDdpStrategy — strategy ddp with train.shard optimizer or gradients (ZeRO's
// stages 1 and 2): each rank keeps and steps only its slice of the optimizer state, and with
// gradients only its slice of the averaged gradients too; the parameters, whole on every rank,
// are allgathered after each step. See Note [Sharded optimizer] in sharded_strategy.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trainer/parallel/ddp_strategy.h"

namespace torch::optim {
class Optimizer;
}

namespace partrain {

class ReduceScatterBucket;

class ShardedDdpStrategy final : public DdpStrategy {
 public:
  ShardedDdpStrategy(const Config& config, const c10::Device& device, comm::Communicator& comm);
  ~ShardedDdpStrategy() override;

  // The Reducer (its buckets padded to a multiple of W), the parameters moved into flat
  // buckets of the same layout, and the optimizer over this rank's block of each.
  void make_optimizer(TrainModel& model) override;
  void start_gradient_averaging(TrainModel& model) override;
  bool step(const UpdateOptions& options, PrecisionPlugin& precision) override;
  // This rank's blocks of the optimizer state go to its own shard; the checkpoint's dict gets
  // only {"name", "shards": W}.
  void save_state(StrategyState& out, bool writer) override;
  void load_state(const SavedStrategyState& saved) override;
  StrategyMemory memory(const TrainModel& model) override;

 private:
  // The global L2 norm of the averaged gradients: each rank's blocks, summed over the ranks.
  double gradient_norm(const std::vector<at::Tensor>& gradients);
  void allgather_parameters();

  int rank_ = 0;
  int world_ = 1;
  std::vector<std::string> names_;           // the Reducer's parameters' names, in its order
  std::vector<at::Tensor> flat_parameters_;  // per bucket, padded; the parameters view them
  std::vector<at::Tensor> blocks_;           // this rank's block of each: what the optimizer steps
  std::vector<at::Tensor> gradient_shards_;  // shard gradients: this rank's block of each sum
  std::unique_ptr<ReduceScatterBucket> reduction_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace partrain
