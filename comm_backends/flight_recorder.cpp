#include "comm_backends/flight_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace partrain::comm {
namespace {

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The caller's mark, per thread: the Reducer's communication thread marks its buckets while
// the training thread runs the step exchange.
struct Mark {
  FlightOp op = FlightOp::kNone;
  std::int32_t bucket = -1;
};
thread_local Mark current_mark;

}  // namespace

std::string_view FlightEntry::op_name() const {
  if (op == FlightOp::kStepExchange) return "step exchange";
  return collective_kind_name(kind);
}

std::uint64_t FlightRecorder::enter(FlightOp op, int bucket, std::size_t) {
  current_mark = Mark{op, bucket};
  return 1;
}

void FlightRecorder::leave(std::uint64_t) { current_mark = Mark{}; }

std::uint64_t FlightRecorder::begin(int comm, std::uint64_t seq, CollectiveKind kind,
                                    std::size_t bytes) {
  const double now = unix_seconds_now();
  const Mark mark = current_mark;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t order = next_order_++;
  FlightEntry& e = ring_[order % kCapacity];
  e = FlightEntry{};
  e.seq = seq;
  e.order = order;
  e.comm = comm;
  e.kind = kind;
  e.op = mark.op;
  e.bucket = mark.bucket;
  e.bytes = bytes;
  e.step = step_.load(std::memory_order_relaxed);
  e.start_s = now;
  return order;
}

void FlightRecorder::end(std::uint64_t order, std::string_view algorithm) {
  const double now = unix_seconds_now();
  std::lock_guard<std::mutex> lock(mutex_);
  FlightEntry& e = ring_[order % kCapacity];
  if (e.order != order) return;  // overwritten by kCapacity newer ones: nothing to mark
  e.end_s = now;
  const std::size_t n = std::min(algorithm.size(), e.algorithm.size() - 1);
  std::memcpy(e.algorithm.data(), algorithm.data(), n);
  e.algorithm[n] = '\0';
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::vector<FlightEntry> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const FlightEntry& e : ring_) {
      if (e.seq != 0) out.push_back(e);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const FlightEntry& a, const FlightEntry& b) { return a.order < b.order; });
  return out;
}

void FlightRecorder::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_ = {};
  next_order_ = 1;
}

FlightRecorder& flight_recorder() {
  static FlightRecorder recorder;
  return recorder;
}

}  // namespace partrain::comm
