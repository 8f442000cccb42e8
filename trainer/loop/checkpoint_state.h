// defines: CheckpointState — state a part of the trainer keeps beside the model and the
// optimizer (PowerSGD's factors and error buffers), saved under its own key of a checkpoint's
// dict by its own functions; the Checkpointer only calls them (checkpoint.h, attach()).
#pragma once

#include <string>

namespace c10 {
struct IValue;
}

namespace partrain {

class CheckpointState {
 public:
  virtual ~CheckpointState() = default;
  // The checkpoint dict's key; each kind of state has its own.
  virtual std::string key() const = 0;
  // On every rank, whenever a checkpoint may be written, so that it may run collectives
  // (gather what each rank holds); rank 0's value goes into the checkpoint.
  virtual c10::IValue save() = 0;
  // On every rank, with the value save() returned on rank 0 when the checkpoint was written.
  // Throws UsageError naming `path` when it does not fit this run.
  virtual void load(const c10::IValue& saved, const std::string& path) = 0;
};

}  // namespace partrain
