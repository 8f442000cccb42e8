#include "trainer/loop/observer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "trainer/observe/trace_format.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {
namespace {

constexpr std::size_t kParts = kBreakdownParts.size();

// A rank's trace as it travels: its clock offset, the round trip and the spans it dropped,
// then its records.
constexpr std::size_t kTraceHeader = 3;

std::string trace_key(int rank) { return "observe/trace/" + std::to_string(rank); }

}  // namespace

RunObserver::RunObserver(const Config& config, const WorkerEnv& env)
    : config_(config), env_(env), faults_(injected_faults(env.rank)), straggler_(env.world_size) {}

double RunObserver::local_seconds(Clock::time_point t) const {
  return std::chrono::duration<double>(t.time_since_epoch()).count() + faults_.clock_skew_s;
}

double RunObserver::common_seconds(Clock::time_point t) const {
  return local_seconds(t) - clock_.offset_s;
}

void RunObserver::sync_clocks(comm::Store* store) {
  store_ = store;
  if (store == nullptr || env_.world_size < 2) return;
  clock_ = estimate_clock_offset(*store, env_.rank, env_.world_size, kClockRounds,
                                 [this](Clock::time_point t) { return local_seconds(t); });
}

void RunObserver::start() {
  times_ = PhaseTimes(Clock::now());
  if (config_.observe.trace) {
    const std::size_t share = kMaxTraceSpans / static_cast<std::size_t>(env_.world_size);
    times_.trace_steps(config_.observe.trace_first_step, config_.observe.trace_last_step,
                       std::max<std::size_t>(share, 1000));
  }
  epoch_start_ = times_.start();
  end_ = times_.start();
}

void RunObserver::inject_step_delay() const {
  if (faults_.step_delay_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(faults_.step_delay_s));
  }
}

void RunObserver::after_batch(bool sync, std::int64_t step,
                              const std::vector<BucketTiming>& buckets) {
  if (!sync || buckets.empty()) return;
  arrivals_.push_back(common_seconds(buckets.front().start));
  times_.add_collectives(step, buckets);
}

std::vector<Breakdown> RunObserver::end_epoch(comm::Communicator* comm, const c10::Device& device) {
  const PhaseTimes::Snapshot now = times_.snapshot();
  const Breakdown mine = breakdown_between(epoch_start_, now);
  epoch_start_ = now;
  const int world = comm ? comm->size() : 1;
  // Every rank writes only its own slots: [parts | arrival count | arrivals] per rank, so that
  // the sum over the ranks hands each rank everyone's. Every rank took the same sync steps
  // (each was a collective), so the slots have one size everywhere.
  const std::size_t n = arrivals_.size();
  const std::size_t slot = kParts + 1 + n;
  std::vector<double> values(slot * static_cast<std::size_t>(world), 0.0);
  double* own = &values[slot * static_cast<std::size_t>(comm ? comm->rank() : 0)];
  for (std::size_t p = 0; p < kParts; ++p) own[p] = mine.*kBreakdownParts[p].second;
  own[kParts] = static_cast<double>(n);
  std::copy(arrivals_.begin(), arrivals_.end(), own + kParts + 1);
  arrivals_.clear();
  sum_over_ranks(comm, values, device);

  std::vector<Breakdown> all(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const double* v = &values[slot * static_cast<std::size_t>(r)];
    for (std::size_t p = 0; p < kParts; ++p) all[r].*kBreakdownParts[p].second = v[p];
    PARTRAIN_CHECK(static_cast<std::size_t>(v[kParts]) == n, Error, "rank ", r, " took ", v[kParts],
                   " sync steps this epoch, rank ", env_.rank, " took ", n);
  }
  std::vector<double> step(static_cast<std::size_t>(world));
  StragglerCount epoch_count(world);
  for (std::size_t k = 0; k < n && world > 1; ++k) {
    for (int r = 0; r < world; ++r)
      step[r] = values[slot * static_cast<std::size_t>(r) + kParts + 1 + k];
    straggler_.add_step(step);
    epoch_count.add_step(step);
  }
  // Rank 0's training time this epoch: the same figure on every rank after the sum above.
  const std::optional<Straggler> verdict = epoch_count.verdict(all[0].total());
  straggler_news_ = straggler_change(epoch_straggler_, verdict);
  epoch_straggler_ = verdict;
  return all;
}

void RunObserver::finish() { end_ = times_.snapshot(); }

std::optional<Straggler> RunObserver::straggler() const {
  return straggler_.verdict(breakdown().total());
}

void RunObserver::write_trace(const std::string& backend) {
  if (!config_.observe.trace) return;
  std::vector<TraceRecord> records;
  records.reserve(times_.spans().size());
  for (const TimedSpan& s : times_.spans()) {
    TraceRecord r;
    r.kind = s.collective >= 0 ? TraceRecord::kAllreduce : static_cast<int>(s.phase);
    r.bucket = s.collective;
    r.step = s.step;
    r.bytes = static_cast<double>(s.bytes);
    r.start_s = common_seconds(s.start);
    r.end_s = common_seconds(s.end);
    records.push_back(r);
  }
  const bool many = store_ != nullptr && env_.world_size > 1;
  if (env_.rank != 0) {
    if (!many) return;
    std::vector<double> values{clock_.offset_s, clock_.round_trip_s,
                               static_cast<double>(times_.dropped_spans())};
    const std::vector<double> packed = pack_trace_records(records);
    values.insert(values.end(), packed.begin(), packed.end());
    std::vector<std::uint8_t> bytes(values.size() * sizeof(double));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    store_->set(trace_key(env_.rank), bytes);
    return;
  }
  TraceInfo info;
  info.backend = backend;
  info.origin_s = common_seconds(times_.start().at);
  info.first_step = config_.observe.trace_first_step;
  info.last_step = config_.observe.trace_last_step;
  info.clock_offset_s.push_back(0.0);
  info.round_trip_s.push_back(0.0);
  info.dropped.push_back(times_.dropped_spans());
  std::vector<std::vector<TraceRecord>> ranks{records};
  for (int r = 1; many && r < env_.world_size; ++r) {
    const std::vector<std::uint8_t> bytes = store_->get(trace_key(r));  // bounded by its timeout
    PARTRAIN_CHECK(bytes.size() % sizeof(double) == 0 &&
                       bytes.size() / sizeof(double) >= kTraceHeader &&
                       (bytes.size() / sizeof(double) - kTraceHeader) % kTraceRecordValues == 0,
                   CommError, "trace: rank ", r, " sent a malformed trace through the store");
    std::vector<double> values(bytes.size() / sizeof(double));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    info.clock_offset_s.push_back(values[0]);
    info.round_trip_s.push_back(values[1]);
    info.dropped.push_back(static_cast<std::size_t>(values[2]));
    ranks.push_back(unpack_trace_records(values.data() + kTraceHeader,
                                         (values.size() - kTraceHeader) / kTraceRecordValues));
  }
  write_file_atomically(config_.output_dir + "/trace.json", trace_to_json(ranks, info));
}

}  // namespace partrain
