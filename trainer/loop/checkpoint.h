// defines: Checkpointer and TrainingPosition — periodic checkpoints that survive a crash at
// any moment, resuming from the newest complete one, and best.pt (the epoch of the highest
// test accuracy). See checkpoint.cpp for the layout.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/loop/checkpoint_format.h"
#include "trainer/loop/worker.h"
#include "trainer/precision/loss_scale.h"
#include "trainer/report/report_writer.h"

namespace torch::nn {
class Module;
}

namespace partrain {
namespace comm {
class Communicator;
}
class Strategy;
class TrainModel;
// Where training stands, beyond the model and optimizer: all a checkpoint needs for a resumed
// run to continue exactly as an uninterrupted one (the learning rate is a function of step).
struct TrainingPosition {
  int epoch = 0;                               // epochs completed
  std::int64_t step = 0;                       // optimizer steps taken, skipped ones included
  std::optional<LossScalerState> loss_scaler;  // precision f16 only
  MidEpoch mid_epoch;                          // where in epoch `epoch + 1`, if mid-epoch
  // Global-batch mode: how the next micro-steps are split over the ranks, when that is not
  // the config's own split (data.balance auto moved it). Saved: empty means data.shares. On
  // resume: the checkpoint's split when it was auto's at the same world size and micro-batch.
  std::vector<std::int64_t> shares;
  std::string source;  // checkpoint file it came from
  int written_by = 0;  // ranks of the run that wrote it
};

class Checkpointer {
 public:
  Checkpointer(const Config& config, const WorkerEnv& env);

  // Loads the checkpoint that checkpoint.resume selects on rank 0 (auto: the newest complete
  // one in rank 0's OUTPUT/checkpoints, if any) into the model and the strategy (its optimizer
  // and what else it keeps) on every rank: ranks that see rank 0's very file read it, and rank
  // 0 broadcasts it to a run where some do not, so hosts without a shared filesystem resume at
  // the same epoch. Call after Strategy::make_optimizer(). Returns epoch 0
  // when starting fresh. Throws UsageError when the checkpoint does not fit this run (another
  // model or optimizer; another world size, unless both runs have the same
  // data.global_batch_size and accumulate_steps).
  TrainingPosition resume(TrainModel& model, Strategy& strategy);
  // Epoch records of the run up to the resumed checkpoint (for the report).
  const std::vector<EpochRecord>& previous_epochs() const { return previous_epochs_; }

  // After epoch `at.epoch`, whose record ends `epochs`. On rank 0, every
  // checkpoint.every_epochs (and at the last epoch): write, sync, rename, then the manifest,
  // then prune to checkpoint.keep; other ranks wait at a barrier so no rank runs ahead of a
  // checkpoint that might be needed. And whenever the epoch's test accuracy beats every
  // earlier epoch's, rank 0 writes the same checkpoint as best.pt (atomically, no barrier).
  void maybe_save(const TrainingPosition& at, const TrainModel& model, Strategy& strategy,
                  const std::vector<EpochRecord>& epochs);

  // Mid-epoch, after the optimizer step `at.step` (at.mid_epoch says where in the epoch): rank
  // 0 writes epoch-E.step-S.pt (write, sync, rename), the manifest, prunes to
  // checkpoint.keep; every rank waits at a barrier. Returns the file's name (on rank 0).
  std::string save_step(const TrainingPosition& at, const TrainModel& model, Strategy& strategy,
                        const std::vector<EpochRecord>& epochs);
  // checkpoint.every_steps says `step` gets a checkpoint (the same answer on every rank).
  bool step_checkpoint_due(std::int64_t step) const;
  // checkpoint.every_seconds has passed on this rank's clock since the last checkpoint (or
  // the start); only rank 0's answer counts (see StepSlots::checkpoint_due).
  bool timed_checkpoint_due() const;

  std::string directory() const { return dir_; }

 private:
  struct Fetched;

  // Saving: `name` (none: best.pt only) and, if `best`, best.pt; every rank.
  void save(const std::string& name, bool best, const TrainingPosition& at, const TrainModel& model,
            Strategy& strategy, const std::vector<EpochRecord>& epochs);
  c10::IValue checkpoint_dict(
      const TrainingPosition& at, const torch::nn::Module& model,
      const std::vector<EpochRecord>& epochs,
      const std::vector<std::pair<std::string, c10::IValue>>& entries) const;
  void write_checkpoint(const std::string& name, const TrainingPosition& at,
                        const c10::IValue& dict);
  void prune_checkpoints() const;
  void prune_shards() const;

  // Resuming, in order; the loading steps are in checkpoint.cpp.
  std::string choose_checkpoint() const;  // rank 0: the file to resume from, or ""
  Fetched fetch_checkpoint(comm::Communicator* comm) const;
  c10::IValue read_shard(const std::string& checkpoint, int shard, int world,
                         comm::Communicator* comm) const;
  void check_fits_this_run(const CheckpointMeta& meta, const std::string& path) const;
  std::vector<std::int64_t> resumed_shares(const CheckpointMeta& meta) const;

  const Config& config_;
  WorkerEnv env_;
  std::string dir_;
  std::vector<EpochRecord> previous_epochs_;
  c10::Device device_{c10::kCPU};  // the model's, over which a collective of nccl must run
  std::chrono::steady_clock::time_point last_save_ = std::chrono::steady_clock::now();
  int saves_ = 0;  // checkpoints this process has begun to write (PARTRAIN_TEST_SAVE_FAULT)
};

}  // namespace partrain
