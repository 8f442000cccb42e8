// defines: FlightRecorder and FlightEntry — every rank's last collectives (the gradient
// buckets' allreduces, the step exchange) in a fixed ring, flight_recorder() (the process's
// one), dump_flight() (OUTPUT/flight/rank-R.json when a run fails), describe_flight() (where a
// rank stood, in words) and explain_flight() (`partrain explain OUTPUT/flight`: where each
// rank stood and who held the others up). LibTorch-free.
//
// Every rank runs the same collectives in the same order, so the n-th recorded collective is
// the same one on every rank: "#n" names it across the ranks. A rank that stopped in #135
// while another had entered #136 is the one the others waited for.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace partrain {

enum class FlightOp : std::uint8_t { kAllreduce, kStepExchange };
std::string_view flight_op_name(FlightOp op);  // "allreduce", "step exchange"

struct FlightEntry {
  std::uint64_t seq = 0;  // 1, 2, ... per rank; 0: an empty slot
  FlightOp op = FlightOp::kAllreduce;
  std::int32_t bucket = -1;  // the gradient bucket of an allreduce
  std::uint64_t bytes = 0;
  std::int64_t step = -1;  // the optimizer step it belongs to
  double start_s = 0;      // Unix time (every rank of a host shares the clock)
  double end_s = -1;       // -1 while the collective has not returned
};

// Thread-safe (the Reducer's communication thread and the training thread both record); an
// entry costs a lock and two clock reads, no allocation.
class FlightRecorder {
 public:
  static constexpr std::size_t kCapacity = 64;

  // Before a collective: returns its sequence number for leave().
  std::uint64_t enter(FlightOp op, int bucket, std::size_t bytes);
  // After it returned; a collective that throws is never left.
  void leave(std::uint64_t seq);
  // The optimizer step the next collectives belong to.
  void set_step(std::int64_t step) { step_.store(step, std::memory_order_relaxed); }
  // The entries held, oldest first.
  std::vector<FlightEntry> entries() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::array<FlightEntry, kCapacity> ring_{};
  std::uint64_t next_seq_ = 1;
  std::atomic<std::int64_t> step_{-1};
};

FlightRecorder& flight_recorder();

// Where a rank stood at `now_s`: "in allreduce #136 (step 68, bucket 2, 1.1 MB) for 5.0 s" or
// "after step exchange #135 (step 67), 0.2 s ago"; "no collective recorded" when empty.
std::string describe_flight(const std::vector<FlightEntry>& entries, double now_s);

// Writes OUTPUT/flight/rank-R.json atomically: {"schema": "partrain.flight/1", "rank",
// "world_size", "error", "written_s", "collectives": [{"seq", "op", "bucket", "bytes", "step",
// "start_s", "end_s" (null while in flight)}]}. Returns its path. Never throws: a failing rank
// must still report its own error, so a dump that cannot be written returns "".
std::string dump_flight(const std::string& output_dir, int rank, int world_size,
                        std::string_view error, const std::vector<FlightEntry>& entries);

// `partrain explain DIR` where DIR holds rank-*.json (an output folder's flight/): a line per
// rank saying where it stood, the ranks that left no dump, and which rank(s) the others waited
// for. Throws UsageError (one line) when DIR holds no readable dump.
std::string explain_flight(const std::string& dir);

}  // namespace partrain
