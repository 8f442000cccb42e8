// defines: Strategy — one way of training (strategy single | dp | ddp, and ddp with
// train.shard) as one object that owns the whole distributed step: the model it builds and
// keeps the same on every rank, the hooks around backward, the optimizer (built, stepped,
// saved and loaded here), the global gradient norm for clipping and the ranks' agreement on
// the loss scale's verdict — and make_strategy(), which picks the class. The loop, the step and
// the checkpoints call these and nothing else of it. One class per way, each in its own file:
// SingleStrategy and DataParallelStrategy (single_strategy.h), DdpStrategy (ddp_strategy.h),
// ShardedDdpStrategy (sharded_strategy.h).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/model/train_model.h"
#include "trainer/observe/phase_times.h"

namespace partrain {

namespace comm {
class Communicator;
}
class PrecisionPlugin;
struct CompressionRecord;   // report_format.h
struct StrategyState;       // strategy_state.h
struct SavedStrategyState;  // strategy_state.h

// One optimizer update, besides the gradients: the schedule's rate and train.clip_grad_norm.
struct UpdateOptions {
  double lr = 0;
  double clip_grad_norm = 0;  // largest global L2 norm of the averaged gradients; 0: off
};

// What a strategy holds, in bytes, counted from the tensors themselves (each storage once).
struct StrategyMemory {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;  // .grad, the Reducer's buckets, gradient shards
  std::int64_t optimizer_state = 0;
  std::int64_t communication = 0;  // collective buffers, PowerSGD's factors and error buffers
  // Of `gradients`: the most allocated during a backward (train.shard gradients' buckets),
  // which a step's measured peak therefore also holds.
  std::int64_t gradients_in_backward = 0;
};

class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  // The model this rank trains, on the training device, the same on every rank: built from the
  // same seed everywhere, then (ddp) rank 0's parameters and buffers broadcast, so that nothing
  // (e.g. a different LibTorch build) can make the replicas start apart.
  // batchnorm_comm: model.sync_batchnorm's communicator (RankGroup), or null.
  std::unique_ptr<TrainModel> build_model(const ModelShape& shape,
                                          comm::Communicator* batchnorm_comm = nullptr) const;

  // The optimizer train.optimizer names, over the model's parameters (a sharded strategy: over
  // this rank's slice of them). Once, after build_model() and before a checkpoint loads.
  virtual void make_optimizer(TrainModel& model) = 0;

  // From here on, backward passes of `model` feed the gradient averaging. Once, after the model
  // and the optimizer hold their starting state (a resumed checkpoint included).
  virtual void start_gradient_averaging(TrainModel& model);

  // Global-batch mode: this rank's share of each micro-step's samples, `share` of `micro_batch`
  // over all ranks; its gradient counts share / micro_batch in the sum, so that uneven shares
  // still give the mean over every sample. Until called, and with even shares, that is 1 / W.
  // Call between steps; single and dp ignore it.
  virtual void set_rank_share(std::int64_t share, std::int64_t micro_batch);

  // The model's forward (dp: the batch split over the GPUs, outputs on the training device).
  virtual at::Tensor forward(TrainModel& model, const at::Tensor& images) const;

  // Around backward. sync=false: a gradient-accumulation micro-step, no communication.
  // After a sync step's backward, finish_backward() leaves the gradients averaged over the
  // ranks (each rank its slice of them when sharded).
  virtual void prepare_for_backward(bool sync);
  virtual void finish_backward();

  // The update after finish_backward(): with loss scaling the gradients unscaled and checked,
  // the verdict the same on every rank; if finite, clipped to the global norm and stepped at
  // options.lr; the loss scale updated; the gradients zeroed. Returns whether the step was
  // taken (false: skipped for an inf or NaN, on every rank alike).
  virtual bool step(const UpdateOptions& options, PrecisionPlugin& precision) = 0;

  // Before evaluation: rank 0's buffers (BatchNorm statistics) everywhere, as DDP does; with
  // uneven shares (set_rank_share) the mean of every rank's, each counted by its share.
  virtual void share_buffers(TrainModel& model);

  // Checkpoints. save_state() runs on every rank whenever a checkpoint is written (it may run
  // collectives); `writer`: this rank writes the checkpoint's dict (rank 0), others may leave
  // out.entries empty. load_state() runs on every rank with the resumed checkpoint, after
  // make_optimizer(); throws UsageError naming the file when it does not fit.
  virtual void save_state(StrategyState& out, bool writer) = 0;
  virtual void load_state(const SavedStrategyState& saved) = 0;

  // Ends gradient averaging (threads and hooks); the figures below stay readable.
  virtual void stop();

  // The training communicator (ddp), or null.
  comm::Communicator* comm() const { return comm_; }
  virtual double comm_wait_seconds() const;  // blocked in finish_backward
  virtual double comm_busy_seconds();        // the communication thread in its collectives
  virtual std::int64_t comm_bytes();         // handed to the gradient collectives
  virtual std::int64_t comm_buckets();       // bucket collectives so far
  // ddp: the bucket collectives of the last sync step (Reducer::bucket_timings); else empty.
  virtual const std::vector<BucketTiming>& bucket_timings() const;
  // dp: the GPUs each batch is spread over; empty otherwise.
  virtual std::vector<std::string> spread_devices() const;
  // comm.compression powersgd: what it sent; nothing otherwise.
  virtual std::optional<CompressionRecord> compression() const;
  // The memory this rank's strategy holds for `model` (the report's memory breakdown). The base
  // counts the parameters and their .grad; each class adds what else it keeps.
  virtual StrategyMemory memory(const TrainModel& model);

 protected:
  Strategy(const Config& config, const c10::Device& device, comm::Communicator* comm);

  // With loss scaling: `gradients` unscaled, and the ranks' verdicts reduced (max of "found an
  // inf"), so all ranks take or skip the step together. True at once without loss scaling.
  bool unscale_and_agree(PrecisionPlugin& precision, const std::vector<at::Tensor>& gradients);

  const Config& config_;
  c10::Device device_;
  comm::Communicator* comm_;
};

// The class `config` asks for: single, dp, ddp (train.shard none) or sharded ddp. comm: the
// training communicator, null for single and dp. Throws UsageError where the config's parts
// cannot combine (dp with weights for another number of devices).
std::unique_ptr<Strategy> make_strategy(const Config& config, const c10::Device& device,
                                        comm::Communicator* comm);

}  // namespace partrain
