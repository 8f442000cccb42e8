// defines: Strategy — what strategy single | dp | ddp does to the model and to a training
// step: every rank starts from the same model, dp splits each forward over the GPUs, and ddp
// averages the gradients over the ranks (the Reducer) between backward and the optimizer step.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/model/train_model.h"
#include "trainer/observe/phase_times.h"

namespace partrain {

namespace comm {
class Communicator;
}
class Reducer;
class PowerSgd;
class CheckpointState;

class Strategy {
 public:
  // comm: null for single and dp.
  Strategy(const Config& config, const c10::Device& device, comm::Communicator* comm);
  ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  // The model this rank trains, on the training device, the same on every rank: built from
  // the same seed everywhere, then rank 0's parameters and buffers broadcast, so that nothing
  // (e.g. a different LibTorch build) can make the replicas start apart.
  // batchnorm_comm: model.sync_batchnorm's communicator (RankGroup), or null.
  std::unique_ptr<TrainModel> build_model(const ModelShape& shape,
                                          comm::Communicator* batchnorm_comm = nullptr) const;

  // ddp: from here on, backward passes of `model` feed the Reducer (compressed with PowerSGD
  // when comm.compression says so). Call once, after the model holds its final starting state
  // (a resumed checkpoint included).
  void start_gradient_averaging(TrainModel& model);

  // ddp: this rank's share of each micro-step's samples, `share` of `micro_batch` over all
  // ranks; its gradient counts share / micro_batch in the sum (Reducer::set_scale), so that
  // uneven shares still give the mean over every sample. Until called, and with even shares,
  // that is 1 / W. Call between steps; single and dp ignore it.
  void set_rank_share(std::int64_t share, std::int64_t micro_batch);

  // dp: the batch split over the GPUs, the outputs gathered on the training device.
  at::Tensor forward(TrainModel& model, const at::Tensor& images) const;

  // Around backward. sync=false: a gradient-accumulation micro-step, no communication.
  // After a sync step's backward, finish_backward() leaves the gradients averaged over the
  // ranks, identical on every rank.
  void prepare_for_backward(bool sync);
  void finish_backward();

  // Before evaluation: rank 0's buffers (BatchNorm statistics) everywhere, as DDP does; with
  // uneven shares (set_rank_share) the mean of every rank's, each counted by its share.
  void share_buffers(TrainModel& model);

  // Ends gradient averaging (the Reducer's thread and hooks).
  void stop();

  double comm_wait_seconds() const;  // blocked in finish_backward
  double comm_busy_seconds();        // the communication thread in allreduce
  std::int64_t comm_bytes();         // handed to the gradient collectives (Reducer::comm_bytes)
  std::int64_t comm_buckets();       // bucket collectives so far
  // ddp: the Reducer's bucket collectives of the last sync step (see Reducer::bucket_timings);
  // empty otherwise.
  const std::vector<BucketTiming>& bucket_timings() const;
  const std::vector<c10::Device>& dp_devices() const { return dp_devices_; }
  // comm.compression powersgd, once gradient averaging started: the compression (its byte
  // counts), which is also state for the checkpoint. Null otherwise.
  PowerSgd* powersgd() const { return powersgd_.get(); }
  CheckpointState* checkpoint_state() const;
  comm::Communicator* comm() const { return comm_; }

 private:
  const Config& config_;
  c10::Device device_;
  comm::Communicator* comm_;
  std::vector<c10::Device> dp_devices_;
  std::vector<double> dp_weights_;      // data.balance weights under dp, one per device
  std::unique_ptr<PowerSgd> powersgd_;  // before reducer_: the Reducer's thread uses it
  std::unique_ptr<Reducer> reducer_;
  float gradient_scale_ = 0;     // 0: the Reducer's own 1 / W
  double share_of_samples_ = 0;  // b_r / M with uneven shares; 0 with even ones
};

}  // namespace partrain
