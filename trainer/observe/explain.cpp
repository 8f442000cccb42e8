#include "trainer/observe/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace partrain {
namespace {

std::string format(const char* fmt, auto... args) {
  char buf[1024];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

std::string leaf(const RunReport& report, const std::string& key) {
  auto it = report.config_leaves.find(key);
  return it == report.config_leaves.end() ? std::string() : it->second;
}

double share(double part, double total) { return total > 0 ? part / total : 0.0; }

// The bench figure of `backend` whose size is nearest (by ratio) to `bytes`, or null.
const BenchFigure* nearest_figure(const BenchReport& bench, const std::string& backend,
                                  double bytes) {
  const BenchFigure* best = nullptr;
  double best_distance = 0;
  for (const BenchFigure& f : bench.results) {
    if (f.backend != backend || f.bytes <= 0) continue;
    const double distance = std::fabs(std::log(static_cast<double>(f.bytes) / bytes));
    if (!best || distance < best_distance) {
      best = &f;
      best_distance = distance;
    }
  }
  return best;
}

// How fast the gradients travelled: the busbw each rank achieved, and against the bench's
// figure for the same backend at the size of one bucket collective, if a bench report is given.
std::string describe_traffic(const RunReport& report, const BenchReport* bench) {
  const RunSummary& s = report.summary;
  const int world = static_cast<int>(s.ranks.size());
  double bytes = 0, buckets = 0, busbw = 0;
  for (const RankRecord& r : s.ranks) {
    if (r.comm_bytes <= 0 || r.comm_buckets <= 0 || r.comm_busy_seconds <= 0) return "";
    bytes += static_cast<double>(r.comm_bytes) / world;
    buckets += static_cast<double>(r.comm_buckets) / world;
    busbw += achieved_busbw_gbps(r, world) / world;
  }
  if (world < 2) return "";
  const double per_bucket = bytes / buckets;
  std::string out = format(
      "The gradient collectives moved %.1f MB per rank in %.0f bucket collectives of %.2f MB on "
      "average; busbw achieved %.3f GB/s (mean over ranks: 2(W-1)/W of the bytes over the time "
      "the communication thread spent in them, waits for late ranks included)",
      bytes / 1e6, buckets, per_bucket / 1e6, busbw);
  if (s.compression) out += "; with PowerSGD that time includes the compression's arithmetic";
  out += ".\n";
  if (!bench) return out;
  const BenchFigure* f = nearest_figure(*bench, s.env.backend, per_bucket);
  if (!f) {
    return out +
           format("%s has no figure for backend %s.\n", bench->path.c_str(), s.env.backend.c_str());
  }
  out += format(
      "bench allreduce (%s) measured %.3f GB/s for %s at %.2f MB with %d ranks: the "
      "training reached %.0f%% of it.",
      bench->path.c_str(), f->busbw_gbps, s.env.backend.c_str(),
      static_cast<double>(f->bytes) / 1e6, bench->world, 100.0 * share(busbw, f->busbw_gbps));
  const std::string wire = leaf(report, "comm.wire_dtype");
  if (bench->world != world || (!wire.empty() && bench->wire_dtype != wire)) {
    out += format(
        " (the bench ran %d ranks with the %s wire, the training %d with %s: not "
        "quite the same measurement)",
        bench->world, bench->wire_dtype.c_str(), world, wire.c_str());
  }
  return out + "\n";
}

}  // namespace

BenchReport read_bench_report(const std::string& path) {
  const nlohmann::ordered_json doc = read_json_file(path, "the bench report");
  const JsonAt root(doc, path);
  if (root["schema"].string() != "partrain.bench/1") {
    root["schema"].fail("is not partrain.bench/1 (write it with partrain bench allreduce --json)");
  }
  BenchReport bench;
  bench.path = path;
  bench.world = root["world"].integer();
  bench.wire_dtype = root["wire_dtype"].string();
  const JsonAt results = root["results"];
  for (std::size_t i = 0; i < results.size(); ++i) {
    const JsonAt r = results.at(i);
    bench.results.push_back(
        BenchFigure{r["backend"].string(), r["bytes"].count(), r["busbw_gbps"].non_negative()});
  }
  return bench;
}

double achieved_busbw_gbps(const RankRecord& rank, int world_size) {
  if (rank.comm_bytes <= 0 || rank.comm_busy_seconds <= 0 || world_size < 2) return 0;
  return 2.0 * (world_size - 1) / world_size * static_cast<double>(rank.comm_bytes) /
         rank.comm_busy_seconds / 1e9;
}

std::string explain_run(const RunReport& report, const TraceSummary* trace,
                        const BenchReport* bench) {
  const RunSummary& s = report.summary;
  std::string out;
  // The table: one row per rank, each part as a share of that rank's total.
  out += "rank  train_s";
  for (const auto& [name, part] : kBreakdownParts)
    out += format(" %12s", std::string(name).c_str());
  out += "\n";
  Breakdown mean;
  for (const RankRecord& r : s.ranks) {
    PARTRAIN_CHECK(r.breakdown.has_value(), UsageError, report.path, ": ranks[", r.rank,
                   "] has no breakdown (the report was written before partrain recorded one)");
    const Breakdown& b = *r.breakdown;
    out += format("%4d %8.2f", r.rank, b.total());
    for (const auto& [name, part] : kBreakdownParts) {
      out += format(" %11.1f%%", 100.0 * share(b.*part, b.total()));
      mean.*part += b.*part / static_cast<double>(s.ranks.size());
    }
    out += "\n";
  }
  const double total = mean.total();
  auto pct = [&](double part) { return 100.0 * share(part, total); };

  // Where the time went, on the mean rank.
  const double compute = mean.forward + mean.backward + mean.optimizer;
  out += format(
      "\nWhere the time went (mean over %zu rank%s, %.2f s of training each): forward+backward+"
      "optimizer %.1f%%, exposed communication %.1f%%, data wait %.1f%%, evaluation %.1f%%, "
      "checkpoint %.1f%%, other %.1f%%.\n",
      s.ranks.size(), s.ranks.size() == 1 ? "" : "s", total, pct(compute), pct(mean.comm_exposed),
      pct(mean.data_wait), pct(mean.evaluation), pct(mean.checkpoint), pct(mean.other));
  std::string_view largest;
  double largest_seconds = -1;
  for (const auto& [name, part] : kBreakdownParts) {
    if (mean.*part > largest_seconds) {
      largest_seconds = mean.*part;
      largest = name;
    }
  }
  out += format("The largest part is %s: %.1f%% (%.2f s).\n", std::string(largest).c_str(),
                pct(largest_seconds), largest_seconds);

  // Who was slow.
  if (s.straggler) {
    const Straggler& g = *s.straggler;
    out += format(
        "Rank %d was the straggler: it arrived last at the gradient allreduce in %lld of %lld "
        "steps (%.0f%%), and the others waited %.2f s for it (%.1f%% of training).\n",
        g.rank, static_cast<long long>(g.steps_last), static_cast<long long>(g.steps),
        100.0 * share(static_cast<double>(g.steps_last), static_cast<double>(g.steps)),
        g.seconds_cost, pct(g.seconds_cost));
  } else if (s.ranks.size() > 1) {
    out +=
        "No straggler: no rank arrived last in more than 60% of the steps at a cost of 2% "
        "of training or more.\n";
  }

  out += describe_traffic(report, bench);

  // What would help, each from the figure above it.
  std::vector<std::string> advice;
  // The others' wait for a straggler is spent in finish_backward too; what is left of the
  // mean exposed communication after that wait is the transfer backward did not hide.
  const double world = static_cast<double>(s.ranks.size());
  const double straggler_wait = s.straggler ? s.straggler->seconds_cost * (world - 1) / world : 0;
  const double transfer = std::max(0.0, mean.comm_exposed - straggler_wait);
  if (share(transfer, total) >= kCommExposedNotable) {
    const std::string wire = leaf(report, "comm.wire_dtype");
    std::string tips;
    if (!s.compression) {
      tips +=
          "comm.compression powersgd (low-rank factors instead of the gradients, for slow "
          "links), ";
    }
    if (wire == "f32") tips += "comm.wire_dtype bf16 (half the bytes on the wire), ";
    tips += "larger buckets (comm.bucket_mb is " + leaf(report, "comm.bucket_mb") +
            ", fewer and larger allreduces), or a faster backend than " + s.env.backend;
    advice.push_back(format(
        "Exposed communication is %.1f%% of training%s: backward did not hide the gradient "
        "allreduce. Try %s.",
        pct(transfer), s.straggler ? " after the wait for the straggler" : "", tips.c_str()));
  } else if (s.straggler && share(mean.comm_exposed, total) >= kCommExposedNotable) {
    advice.push_back(format(
        "Exposed communication is %.1f%% of training, but %.1f%% of it is the wait for rank %d: "
        "the transfer itself is %.1f%%, so a faster wire would not help before the straggler "
        "is fixed.",
        pct(mean.comm_exposed), pct(straggler_wait), s.straggler->rank, pct(transfer)));
  }
  const RankRecord* hungriest = nullptr;
  for (const RankRecord& r : s.ranks) {
    if (!hungriest || share(r.breakdown->data_wait, r.breakdown->total()) >
                          share(hungriest->breakdown->data_wait, hungriest->breakdown->total())) {
      hungriest = &r;
    }
  }
  if (hungriest) {
    const double data_share = share(hungriest->breakdown->data_wait, hungriest->breakdown->total());
    if (data_share >= kDataWaitNotable) {
      advice.push_back(
          format("Rank %d waited for data %.1f%% of its training: more loader threads would help "
                 "(data.num_workers is %s).",
                 hungriest->rank, 100.0 * data_share, leaf(report, "data.num_workers").c_str()));
    }
  }
  if (s.straggler) {
    advice.push_back(format(
        "Balance the ranks' work or look at rank %d's machine: removing its lateness would save "
        "up to %.2f s (%.1f%%).",
        s.straggler->rank, s.straggler->seconds_cost, pct(s.straggler->seconds_cost)));
  }
  if (share(mean.optimizer, total) >= kOptimizerNotable) {
    advice.push_back(
        format("The optimizer takes %.1f%% of training: a fused or cheaper optimizer "
               "step would help.",
               pct(mean.optimizer)));
  }
  if (advice.empty()) {
    advice.push_back(format(
        "Nothing beside the computation stands out: forward+backward+optimizer are %.1f%%, so "
        "a faster device or a smaller model is what would speed this run up.",
        pct(compute)));
  }
  for (const auto& a : advice) out += a + "\n";

  if (trace && trace->allreduces > 0) {
    const double per_span_ms = trace->allreduce_us / static_cast<double>(trace->allreduces) / 1e3;
    out +=
        format("Trace (steps %lld..%lld, %d rank%s): %zu bucket allreduces of %.2f ms on average",
               static_cast<long long>(trace->first_step), static_cast<long long>(trace->last_step),
               trace->ranks, trace->ranks == 1 ? "" : "s", trace->allreduces, per_span_ms);
    if (trace->matched > 0) {
      out += format("; the ranks arrived %.2f ms apart on average over %zu matched allreduces",
                    trace->arrival_spread_us / 1e3, trace->matched);
    }
    out += ".\n";
  } else if (trace) {
    out += "Trace: no allreduce spans (single process, or no step in the traced window).\n";
  }
  return out;
}

}  // namespace partrain
