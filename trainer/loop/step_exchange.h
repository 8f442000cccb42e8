// defines: StepSlots and exchange_step() — the one small collective after each optimizer step
// through which the ranks agree on what to do next (stop, checkpoint), each from the same
// numbers.
//
// Every rank fills its slots, then one sum-allreduce of f64 values gives everyone every
// rank's contribution. A slot a rank does not write stays 0, so a slot may be a count (stop
// requests: each rank adds 1) or hold rank 0's value alone (its clock's verdict). Each piece
// of the loop that needs a slot gets a named accessor here; adding one does not move the
// others' meaning. With single and dp (no communicator) the values stay local.
//
//   [0]          stop requests: ranks that got SIGTERM, SIGINT or SIGUSR1 (common/stop_request.h)
//   [1]          checkpoint due: 1 when rank 0's clock says checkpoint.every_seconds has passed
//   [2 .. 2+W)   busy seconds per sample: the wall time of rank r's own work over a step
//                (data wait, forward, backward, optimizer) and of its stalls outside that work
//                (trainer/observe/stall_meter.h), divided by its samples, in slot 2 + r
//                (data.balance auto; 0 when not measured)
//   [2+W .. 2+2W) the fraction of that step's wall time rank r ran, in slot 2 + W + r (auto)
//   [2+2W]       the step's wall seconds on rank 0's clock (auto: judges its moves)
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <vector>

namespace partrain {

namespace comm {
class Communicator;
}

class StepSlots {
 public:
  explicit StepSlots(int world_size = 1)
      : world_(static_cast<std::size_t>(world_size)),
        values_(kSecondsPerSample + 2 * world_ + 1, 0.0) {}

  double& stop_requests() { return values_[kStopRequests]; }
  double& checkpoint_due() { return values_[kCheckpointDue]; }
  double& seconds_per_sample(int rank) { return values_.at(kSecondsPerSample + rank_slot(rank)); }
  // Every rank's, in rank order (after the exchange).
  std::vector<double> seconds_per_sample() const { return ranks_from(kSecondsPerSample); }
  double& running(int rank) { return values_.at(kSecondsPerSample + world_ + rank_slot(rank)); }
  std::vector<double> running() const { return ranks_from(kSecondsPerSample + world_); }
  double& step_seconds() { return values_[kSecondsPerSample + 2 * world_]; }

  std::vector<double>& values() { return values_; }

 private:
  std::vector<double> ranks_from(std::size_t first) const {
    const auto begin = values_.begin() + static_cast<std::ptrdiff_t>(first);
    return {begin, begin + static_cast<std::ptrdiff_t>(world_)};
  }
  std::size_t rank_slot(int rank) const {
    return rank >= 0 && static_cast<std::size_t>(rank) < world_ ? static_cast<std::size_t>(rank)
                                                                : world_;  // at() throws
  }

  static constexpr std::size_t kStopRequests = 0;
  static constexpr std::size_t kCheckpointDue = 1;
  static constexpr std::size_t kSecondsPerSample = 2;  // W slots, W of running, step seconds
  std::size_t world_;
  std::vector<double> values_;
};

// Sums every rank's slots into every rank's `slots` (sum_over_ranks: the values travel as a
// tensor on `device`, since nccl reads device memory only). Every rank of the run must call it
// after the same steps. Throws what the collective throws (a peer lost or timed out).
void exchange_step(StepSlots& slots, comm::Communicator* comm, const c10::Device& device);

}  // namespace partrain
