// defines: DdpStrategy — strategy ddp with train.shard none: one process per rank, each with
// the whole model and the whole optimizer; the Reducer averages the gradients over the ranks
// while backward runs (Note [Reducer]), optionally compressed with PowerSGD, so that every rank
// applies the same update to the same parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/optim/optimizer.h"
#include "trainer/parallel/strategy.h"

namespace partrain {

class Reducer;
class PowerSgd;

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(const Config& config, const c10::Device& device, comm::Communicator& comm);
  ~DdpStrategy() override;

  void make_optimizer(TrainModel& model) override;
  // Makes the Reducer over the parameters (comm.bucket_mb, comm.timeout_s), compressed with
  // PowerSGD when comm.compression says so.
  void start_gradient_averaging(TrainModel& model) override;
  void set_rank_share(std::int64_t share, std::int64_t micro_batch) override;
  void prepare_for_backward(bool sync) override;
  void finish_backward() override;
  bool step(const UpdateOptions& options, PrecisionPlugin& precision) override;
  void share_buffers(TrainModel& model) override;
  // The optimizer, and with PowerSGD its state (key "powersgd": a collective, every rank's
  // error buffers gathered).
  void save_state(StrategyState& out, bool writer) override;
  void load_state(const SavedStrategyState& saved) override;
  void stop() override;

  double comm_wait_seconds() const override;
  double comm_busy_seconds() override;
  std::int64_t comm_bytes() override;
  std::int64_t comm_buckets() override;
  const std::vector<BucketTiming>& bucket_timings() const override;
  std::optional<CompressionRecord> compression() const override;
  StrategyMemory memory(const TrainModel& model) override;

 protected:
  float gradient_scale() const { return gradient_scale_; }
  double share_of_samples() const { return share_of_samples_; }

  std::unique_ptr<Reducer> reducer_;

 private:
  std::unique_ptr<ReplicatedOptimizer> optimizer_;
  std::unique_ptr<PowerSgd> powersgd_;  // outlives the Reducer: the report reads its counts
  // A resumed checkpoint's PowerSGD state, until start_gradient_averaging() makes PowerSGD.
  std::optional<c10::IValue> resumed_powersgd_;
  std::string resumed_from_;
  float gradient_scale_ = 0;     // 0: the Reducer's own 1 / W
  double share_of_samples_ = 0;  // b_r / M with uneven shares; 0 with even ones
};

}  // namespace partrain
