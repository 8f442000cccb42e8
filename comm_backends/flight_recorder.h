// defines: FlightRecorder, FlightEntry, FlightOp and flight_recorder() — every collective of
// every communicator of the process (make_communicator()'s, through CheckedCommunicator), the
// last kCapacity of them in a fixed ring, for the dump a failed run leaves
// (trainer/observe/flight_recorder.h writes and explains it).
//
// Each entry is numbered as its communicator numbers its calls (#N in the backend's own
// errors: "allreduce #12 of ..."), and names the communicator by its instance number, which
// every rank gives the same communicator (communicator_key_prefix()). So "#N of communicator
// C" is the same collective on every rank, and a rank that stopped in #135 while another had
// entered #136 is the one the others waited for.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <vector>

#include "comm_backends/collective_call.h"

namespace partrain::comm {

// What a caller marks the collectives it runs for (the trainer: a gradient bucket, the step
// exchange); kNone for the rest.
enum class FlightOp : std::uint8_t { kNone, kAllreduce, kStepExchange };

struct FlightEntry {
  std::uint64_t seq = 0;    // the communicator's call number; 0: an empty slot
  std::uint64_t order = 0;  // the recorder's own count, for the order of the entries
  std::int32_t comm = 0;    // the communicator's instance number
  CollectiveKind kind = CollectiveKind::allreduce;
  FlightOp op = FlightOp::kNone;
  std::int32_t bucket = -1;  // the gradient bucket the caller marked
  std::uint64_t bytes = 0;
  std::int64_t step = -1;            // the optimizer step it belongs to
  double start_s = 0;                // Unix time (every rank of a host shares the clock)
  double end_s = -1;                 // -1 while the collective has not returned
  std::array<char, 24> algorithm{};  // the backend's algorithm, once it returned

  // "allreduce", "broadcast", ..., or "step exchange" for a collective marked so.
  std::string_view op_name() const;
  std::string_view algorithm_name() const { return {algorithm.data()}; }
};

// Thread-safe; an entry costs a lock and two clock reads, no allocation.
class FlightRecorder {
 public:
  static constexpr std::size_t kCapacity = 64;

  // The caller's mark: the collectives this thread runs until leave() are for `op` (and
  // `bucket`). Returns what leave() takes.
  std::uint64_t enter(FlightOp op, int bucket, std::size_t bytes);
  void leave(std::uint64_t mark);
  // The optimizer step the next collectives belong to.
  void set_step(std::int64_t step) { step_.store(step, std::memory_order_relaxed); }

  // A communicator's call `seq` starts; returns what end() takes. A collective that throws is
  // never ended.
  std::uint64_t begin(int comm, std::uint64_t seq, CollectiveKind kind, std::size_t bytes);
  void end(std::uint64_t order, std::string_view algorithm);

  // The entries held, oldest first.
  std::vector<FlightEntry> entries() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::array<FlightEntry, kCapacity> ring_{};
  std::uint64_t next_order_ = 1;
  std::atomic<std::int64_t> step_{-1};
};

FlightRecorder& flight_recorder();

}  // namespace partrain::comm
