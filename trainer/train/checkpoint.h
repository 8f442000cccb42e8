// defines: Checkpointer and TrainingPosition — periodic checkpoints that survive a crash at
// any moment, and resuming from the newest complete one. See checkpoint.cpp for the layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/train/report_writer.h"
#include "trainer/train/train_loop.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace partrain {
namespace comm {
class Communicator;
}

struct TrainingPosition {
  int epoch = 0;          // epochs completed
  std::int64_t step = 0;  // optimizer steps taken
  std::string source;     // checkpoint file it came from
};

class Checkpointer {
 public:
  Checkpointer(const Config& config, const WorkerEnv& env);

  // Loads the checkpoint that checkpoint.resume selects on rank 0 (auto: the newest complete
  // one in rank 0's OUTPUT/checkpoints, if any) into model and optimizer on every rank: rank 0
  // broadcasts the file, so hosts without a shared filesystem resume at the same epoch.
  // Returns epoch 0 when starting fresh. Throws UsageError when the checkpoint does not fit
  // this run.
  TrainingPosition resume(torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                          comm::Communicator* comm);
  // Epoch records of the run up to the resumed checkpoint (for the report).
  const std::vector<EpochRecord>& previous_epochs() const { return previous_epochs_; }

  // On rank 0, every checkpoint.every_epochs (and at the last epoch): write, sync, rename,
  // then the manifest, then prune to checkpoint.keep. Other ranks wait at a barrier so no
  // rank runs ahead of a checkpoint that might be needed.
  void maybe_save(int epoch, std::int64_t step, const torch::nn::Module& model,
                  const torch::optim::Optimizer& optimizer, const std::vector<EpochRecord>& epochs,
                  comm::Communicator* comm);

  std::string directory() const { return dir_; }

 private:
  std::string choose_checkpoint() const;  // rank 0: the file to resume from, or ""
  static std::int64_t broadcast_bytes(comm::Communicator& comm, const torch::nn::Module& model,
                                      std::int64_t length, std::string* bytes);

  const Config& config_;
  WorkerEnv env_;
  std::string dir_;
  std::vector<EpochRecord> previous_epochs_;
};

}  // namespace partrain
