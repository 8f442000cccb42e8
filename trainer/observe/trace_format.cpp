#include "trainer/observe/trace_format.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/errors.h"
#include "trainer/observe/phase_times.h"
#include "trainer/report/report_format.h"
#include "trainer/report/report_reader.h"

namespace partrain {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kComputeThread = 1;
constexpr int kCommThread = 2;
constexpr int kDataThread = 3;

int thread_of(const TraceRecord& r) {
  if (r.kind == TraceRecord::kAllreduce) return kCommThread;
  if (r.kind == static_cast<int>(Phase::kDataWait)) return kDataThread;
  return kComputeThread;
}

std::string name_of_record(const TraceRecord& r) {
  if (r.kind == TraceRecord::kAllreduce) return "allreduce bucket " + std::to_string(r.bucket);
  if (r.kind < 0 || r.kind >= static_cast<int>(kPhaseCount)) return "unknown";
  return span_name(static_cast<Phase>(r.kind));
}

Json metadata(const char* what, int pid, int tid, const std::string& name) {
  Json e{{"name", what}, {"ph", "M"}, {"pid", pid}};
  if (tid >= 0) e["tid"] = tid;
  e["args"] = {{"name", name}};
  return e;
}

}  // namespace

std::vector<double> pack_trace_records(const std::vector<TraceRecord>& records) {
  std::vector<double> out;
  out.reserve(records.size() * kTraceRecordValues);
  for (const auto& r : records) {
    out.insert(out.end(), {static_cast<double>(r.kind), static_cast<double>(r.bucket),
                           static_cast<double>(r.step), r.bytes, r.start_s, r.end_s});
  }
  return out;
}

std::vector<TraceRecord> unpack_trace_records(const double* v, std::size_t count) {
  std::vector<TraceRecord> out(count);
  for (std::size_t i = 0; i < count; ++i, v += kTraceRecordValues) {
    out[i].kind = static_cast<int>(v[0]);
    out[i].bucket = static_cast<int>(v[1]);
    out[i].step = static_cast<std::int64_t>(v[2]);
    out[i].bytes = v[3];
    out[i].start_s = v[4];
    out[i].end_s = v[5];
  }
  return out;
}

std::string trace_to_json(const std::vector<std::vector<TraceRecord>>& ranks,
                          const TraceInfo& info) {
  Json events = Json::array();
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    events.push_back(metadata("process_name", r, -1, "rank " + std::to_string(r)));
    events.push_back(Json{
        {"name", "process_sort_index"}, {"ph", "M"}, {"pid", r}, {"args", {{"sort_index", r}}}});
    events.push_back(metadata("thread_name", r, kComputeThread, "compute"));
    events.push_back(metadata("thread_name", r, kCommThread, "communication"));
    events.push_back(metadata("thread_name", r, kDataThread, "data"));
  }
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    for (const TraceRecord& rec : ranks[static_cast<std::size_t>(r)]) {
      // Microseconds with a fraction: the viewers accept it, and short spans keep their size.
      const double ts = std::round((rec.start_s - info.origin_s) * 1e9) / 1e3;
      const double dur = std::round(std::max(0.0, rec.end_s - rec.start_s) * 1e9) / 1e3;
      Json e{{"name", name_of_record(rec)},
             {"cat", rec.kind == TraceRecord::kAllreduce ? "comm" : "step"},
             {"ph", "X"},
             {"ts", ts},
             {"dur", dur},
             {"pid", r},
             {"tid", thread_of(rec)}};
      if (rec.kind == TraceRecord::kAllreduce) {
        e["args"] = {{"step", rec.step},
                     {"bucket", rec.bucket},
                     {"bytes", static_cast<std::int64_t>(rec.bytes)},
                     {"backend", info.backend}};
      } else {
        e["args"] = {{"step", rec.step}};
      }
      events.push_back(std::move(e));
    }
  }
  Json doc;
  doc["traceEvents"] = std::move(events);
  doc["displayTimeUnit"] = "ms";
  doc["otherData"] = {{"backend", info.backend},
                      {"steps", {info.first_step, info.last_step}},
                      {"clock_offset_s", info.clock_offset_s},
                      {"clock_round_trip_s", info.round_trip_s},
                      {"dropped_spans", info.dropped}};
  return doc.dump() + "\n";
}

TraceSummary read_trace_summary(const std::string& path) {
  const Json doc = read_json_file(path, "the trace");
  const JsonAt root(doc, path);
  const JsonAt events = root["traceEvents"];
  TraceSummary s;
  if (root.has("otherData") && root["otherData"].has("steps")) {
    s.first_step = root["otherData"]["steps"].at(0).count();
    s.last_step = root["otherData"]["steps"].at(1).count();
  }
  // (step, bucket) -> per pid start, for the arrival spread.
  std::map<std::pair<std::int64_t, std::int64_t>, std::map<int, double>> starts;
  int max_pid = -1;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const JsonAt e = events.at(i);
    const std::string ph = e["ph"].string();
    const int pid = e["pid"].integer();
    max_pid = std::max(max_pid, pid);
    if (ph != "X") continue;
    const std::string name = e["name"].string();
    e["ts"].number();
    const double dur = e["dur"].non_negative();
    e["tid"].integer();
    s.span_us[name] += dur;
    if (name.rfind("allreduce", 0) == 0) {
      const JsonAt args = e["args"];
      const std::int64_t step = args["step"].count();
      const std::int64_t bucket = args["bucket"].count();
      ++s.allreduces;
      s.allreduce_us += dur;
      if (pid == 0) s.allreduce_bytes += args["bytes"].non_negative();
      starts[{step, bucket}][pid] = e["ts"].number();
    }
  }
  s.ranks = max_pid + 1;
  double spread = 0;
  for (const auto& [key, by_rank] : starts) {
    if (static_cast<int>(by_rank.size()) != s.ranks || s.ranks < 2) continue;
    double lo = by_rank.begin()->second, hi = lo;
    for (const auto& [pid, ts] : by_rank) {
      lo = std::min(lo, ts);
      hi = std::max(hi, ts);
    }
    spread += hi - lo;
    ++s.matched;
  }
  if (s.matched > 0) s.arrival_spread_us = spread / static_cast<double>(s.matched);
  return s;
}

}  // namespace partrain
