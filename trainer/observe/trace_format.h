// defines: TraceRecord, TraceInfo, pack/unpack of records for the gather, trace_to_json() —
// trace.json in Chrome's trace-event format (chrome://tracing, Perfetto) — and TraceSummary /
// read_trace_summary(), what `partrain explain --trace` reads back. LibTorch-free.
//
// The document: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}. Each
// span is a complete event ("ph": "X") with "ts" and "dur" in microseconds on rank 0's clock,
// counted from rank 0's first epoch; pid is the rank, tid the thread it ran on (1 compute,
// 2 communication, 3 data). Metadata events ("ph": "M") name each pid "rank N" and each tid.
// An allreduce span's args hold the bucket, its bytes, the backend and the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace partrain {

// One span on rank 0's clock. kind: a Phase (phase_times.h) as its number, or kAllreduce.
struct TraceRecord {
  static constexpr int kAllreduce = 100;
  int kind = 0;
  int bucket = -1;  // allreduce only
  std::int64_t step = 0;
  double bytes = 0;    // allreduce only
  double start_s = 0;  // seconds on rank 0's clock
  double end_s = 0;
};

// Six f64 values per record, so that the ranks' records travel in one gather.
inline constexpr std::size_t kTraceRecordValues = 6;
std::vector<double> pack_trace_records(const std::vector<TraceRecord>& records);
std::vector<TraceRecord> unpack_trace_records(const double* values, std::size_t count);

struct TraceInfo {
  std::string backend;
  double origin_s = 0;                 // rank 0's clock at its first epoch: ts 0
  std::vector<double> clock_offset_s;  // per rank: its clock minus rank 0's, as estimated
  std::vector<double> round_trip_s;    // per rank: the round trip the estimate came from
  std::int64_t first_step = 0;
  std::int64_t last_step = 0;
  std::vector<std::size_t> dropped;  // per rank: spans beyond the bound, not kept
};

// ranks[r]: rank r's records.
std::string trace_to_json(const std::vector<std::vector<TraceRecord>>& ranks,
                          const TraceInfo& info);

// What a trace says about the gradient allreduces of its steps.
struct TraceSummary {
  int ranks = 0;
  std::int64_t first_step = 0, last_step = 0;
  std::size_t allreduces = 0;             // spans, all ranks
  double allreduce_us = 0;                // their durations summed
  double allreduce_bytes = 0;             // summed over rank 0's spans
  std::size_t matched = 0;                // (step, bucket) pairs seen on every rank
  double arrival_spread_us = 0;           // over those: mean of latest start minus earliest start
  std::map<std::string, double> span_us;  // every complete event's duration by name, all ranks
};

// Reads trace.json written by trace_to_json() (or any trace with those fields). A missing or
// ill-typed field is a UsageError naming the file and the event.
TraceSummary read_trace_summary(const std::string& path);

}  // namespace partrain
