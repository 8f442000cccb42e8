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
  // The gradient buckets are allreduces: another collective's busbw says nothing of them.
  if (root["collective"].string() != "allreduce") {
    root["collective"].fail("is not allreduce (the gradient collectives are allreduces)");
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

namespace {

// Where each rank's peak resident memory went (ranks[].memory), the spread of the peaks over
// the ranks, and what train.shard would take off where the run did not shard. "" for reports
// without a memory breakdown (CUDA runs, older reports).
std::string describe_memory(const RunReport& report) {
  const RunSummary& s = report.summary;
  for (const RankRecord& r : s.ranks) {
    if (!r.memory) return "";
  }
  std::string out = "\nWhere memory went (MiB of each rank's peak resident memory):\nrank  peak_mb";
  for (const auto& [name, part] : kMemoryParts) {
    std::string column(name);
    column.resize(column.size() - 3);  // without "_mb"
    out += format(" %15s", column.c_str());
  }
  out += "\n";
  double low = 0, high = 0;
  for (const RankRecord& r : s.ranks) {
    out += format("%4d %8.0f", r.rank, r.peak_rss_mb);
    for (const auto& [name, part] : kMemoryParts) out += format(" %15.1f", (*r.memory).*part);
    out += "\n";
    low = low == 0 ? r.peak_rss_mb : std::min(low, r.peak_rss_mb);
    high = std::max(high, r.peak_rss_mb);
  }
  const MemoryBreakdown& m = *s.ranks.front().memory;
  const double state = m.parameters + m.gradients + m.optimizer_state;
  out += format(
      "Rank 0: parameters, gradients and optimizer state %.0f MiB, the step's activations %.0f "
      "MiB, LibTorch's floor %.0f MiB, data %.0f MiB, unexplained %.0f MiB (%.1f%% of its peak).\n",
      state, m.activations, m.floor, m.data, m.unexplained,
      100.0 * share(m.unexplained, s.ranks.front().peak_rss_mb));
  if (s.ranks.size() > 1) {
    out += format("The ranks' peaks lie within %.1f%% of each other (%.0f to %.0f MiB).\n",
                  100.0 * share(high - low, low), low, high);
  }
  const std::string shard = leaf(report, "train.shard");
  const int world = static_cast<int>(s.ranks.size());
  if (world > 1 && (shard.empty() || shard == "none") && m.optimizer_state > 0) {
    const double keep = 1.0 - 1.0 / world;
    out += format(
        "train.shard optimizer would keep 1/%d of the optimizer state on each rank (%.0f MiB "
        "less), gradients 1/%d of the gradients too (about %.0f MiB more).\n",
        world, keep * m.optimizer_state, world, keep * m.gradients);
  }
  return out;
}

}  // namespace

double achieved_busbw_gbps(const RankRecord& rank, int world_size) {
  if (rank.comm_bytes <= 0 || rank.comm_busy_seconds <= 0 || world_size < 2) return 0;
  return 2.0 * (world_size - 1) / world_size * static_cast<double>(rank.comm_bytes) /
         rank.comm_busy_seconds / 1e9;
}

namespace {

double images_of(const RunSummary& s) {
  double n = 0;
  for (const EpochRecord& e : s.epochs) n += static_cast<double>(e.images);
  return n;
}

std::int64_t steps_of(const RunSummary& s) { return s.epochs.empty() ? 0 : s.epochs.back().steps; }

void require_breakdowns(const RunReport& report) {
  for (const RankRecord& r : report.summary.ranks) {
    PARTRAIN_CHECK(r.breakdown.has_value(), UsageError, report.path, ": ranks[", r.rank,
                   "] has no breakdown (the report was written before partrain recorded one)");
  }
}

// The mean breakdown of the ranks that were not the straggler (all of them without one): their
// time is the run's critical path, and their wait for the straggler is in their comm_exposed.
Breakdown mean_of_the_waiting(const RunSummary& s) {
  Breakdown mean;
  int n = 0;
  for (const RankRecord& r : s.ranks) {
    if (s.straggler && s.ranks.size() > 1 && r.rank == s.straggler->rank) continue;
    for (const auto& [name, part] : kBreakdownParts) mean.*part += (*r.breakdown).*part;
    ++n;
  }
  for (const auto& [name, part] : kBreakdownParts) mean.*part /= std::max(1, n);
  return mean;
}

double mean_busy_of_the_waiting(const RunSummary& s) {
  double busy = 0;
  int n = 0;
  for (const RankRecord& r : s.ranks) {
    if (s.straggler && s.ranks.size() > 1 && r.rank == s.straggler->rank) continue;
    busy += r.comm_busy_seconds;
    ++n;
  }
  return busy / std::max(1, n);
}

// The part of `comm_exposed` spent waiting for the straggler (at most all of it).
double straggler_wait(const RunSummary& s, const Breakdown& waiting) {
  return s.straggler ? std::min(s.straggler->seconds_cost, waiting.comm_exposed) : 0.0;
}

// The cores a run's ranks could use: each rank min(threads, its share of its host's cores).
// 0 when a report does not say.
double cores_used(const RunSummary& s) {
  double cores = 0;
  for (const RankRecord& r : s.ranks) {
    if (r.threads <= 0 || r.host_cores <= 0 || r.ranks_on_host <= 0) return 0;
    cores += std::min(static_cast<double>(r.threads),
                      static_cast<double>(r.host_cores) / r.ranks_on_host);
  }
  return cores;
}

bool on_cuda(const RunSummary& s) {
  for (const std::string& d : s.env.devices) {
    if (d.rfind("cuda", 0) == 0) return true;
  }
  return false;
}

std::string host_words(const RankRecord& r) {
  if (r.threads <= 0) return "";
  return format("%d rank%s of %d thread%s on a host of %d cores", r.ranks_on_host,
                r.ranks_on_host == 1 ? "" : "s", r.threads, r.threads == 1 ? "" : "s",
                r.host_cores);
}

bool oversubscribed(const RankRecord& r) {
  return r.threads > 0 && r.threads * r.ranks_on_host > r.host_cores;
}

std::string straggler_words(const Straggler& g) {
  if (g.kind == "away") {
    return format(
        "away for whole steps: %lld of its steps were late by more than a median step "
        "(%.1f ms)",
        static_cast<long long>(g.steps_away), 1e3 * g.median_step_seconds);
  }
  return format("slower at every step: last at %lld of %lld steps",
                static_cast<long long>(g.steps_last), static_cast<long long>(g.steps));
}

const char* cause_of_part(const std::string& part) {
  if (part == "communication") return "communication";
  if (part == "straggler") return "straggler";
  if (part.rfind("compute", 0) == 0 || part == "optimizer") return "compute";
  if (part == "data") return "data";
  if (part == "evaluation") return "evaluation";
  if (part == "checkpoint") return "checkpoint";
  return "other";
}

// What the exposed transfer would become if the collectives' busy time (less the straggler
// wait) were scaled by `factor`, backward hiding as much of it as it hides now.
double predicted_transfer(double transfer_busy, double transfer, double factor) {
  const double hidden = std::max(0.0, transfer_busy - transfer);
  return std::max(0.0, transfer_busy * factor - hidden);
}

}  // namespace

// A baseline or probe is one process training the run's model on the run's data.
void require_single_twin(const RunReport& run, const RunReport& twin, const char* what) {
  const RunSummary& b = twin.summary;
  PARTRAIN_CHECK(b.ranks.size() == 1 && b.env.world_size == 1, UsageError, twin.path, ": the ",
                 what, " is a run of ", b.ranks.size(),
                 " ranks; it must be one process (strategy single, as --with-baseline trains)");
  for (const char* key : {"model.name", "model.width", "data.dataset"}) {
    const std::string ours = leaf(run, key), theirs = leaf(twin, key);
    PARTRAIN_CHECK(ours == theirs, UsageError, twin.path, ": ", key, " is '", theirs,
                   "' but the run's (", run.path, ") is '", ours, "': a ", what,
                   " trains the same model on the same data");
  }
  require_breakdowns(twin);
}

Scaling decompose_speedup(const RunReport& run, const RunReport& baseline, const RunReport* probe) {
  const RunSummary& s = run.summary;
  const RunSummary& b = baseline.summary;
  require_single_twin(run, baseline, "baseline");
  if (probe) require_single_twin(run, *probe, "compute probe");
  require_breakdowns(run);
  const double n_run = images_of(s), n_base = images_of(b);
  PARTRAIN_CHECK(n_run > 0 && n_base > 0 && s.total_seconds > 0 && b.total_seconds > 0, UsageError,
                 run.path, ": the run or its baseline trained no image");

  Scaling out;
  out.baseline = baseline.path;
  const double t_run = s.total_seconds / n_run, t_base = b.total_seconds / n_base;
  out.speedup = t_base / t_run;
  out.train_speedup = b.images_per_s > 0 ? s.images_per_s / b.images_per_s : 0;
  const int world = static_cast<int>(s.ranks.size());
  const double cores = cores_used(s), base_cores = cores_used(b);
  if (on_cuda(s)) {
    out.ideal = static_cast<double>(s.env.devices.size());
    out.ideal_basis = format("%zu devices against one", s.env.devices.size());
  } else if (cores > 0 && base_cores > 0) {
    out.ideal = cores / base_cores;
    out.ideal_basis = format(
        "%d rank%s using %.3g cores against the baseline's %.3g (each rank min(threads, its "
        "host's cores / ranks on it))",
        world, world == 1 ? "" : "s", cores, base_cores);
  } else {
    out.ideal = world;
    out.ideal_basis =
        format("%d ranks against one process (the reports hold no thread counts)", world);
  }

  const Breakdown w = mean_of_the_waiting(s);
  const Breakdown& one = *b.ranks[0].breakdown;
  const double wait = straggler_wait(s, w);
  const double ideal = out.ideal;
  // Each part: what it cost the run beyond the ideal, in seconds, and the words for it.
  auto add_beyond = [&](const char* name, double beyond, std::string figures) {
    out.parts.push_back(
        ScalingPart{name, ideal * beyond / s.total_seconds, beyond, std::move(figures)});
  };
  // Or the run's seconds against the baseline's, spread ideally over the run's ranks.
  auto add = [&](const char* name, double ours, double theirs, std::string figures) {
    add_beyond(name, ours - theirs * n_run / (n_base * ideal), std::move(figures));
  };
  const double per_rank_images = n_run / world;
  const double fb = w.forward + w.backward, fb_base = one.forward + one.backward;
  const double fb_ms = 1e3 * fb / per_rank_images, fb_base_ms = 1e3 * fb_base / n_base;
  const double busbw = achieved_busbw_gbps(s.ranks[0], world);

  add("communication", w.comm_exposed - wait, one.comm_exposed,
      format("exposed communication %.2f s a rank%s; gradient busbw %.3f GB/s",
             w.comm_exposed - wait,
             s.straggler ? format(" (comm_exposed %.2f s less %.2f s waiting for rank %d)",
                                  w.comm_exposed, wait, s.straggler->rank)
                               .c_str()
                         : "",
             busbw));
  add("straggler", wait, 0,
      s.straggler ? format("the others waited %.2f s for rank %d, %s", wait, s.straggler->rank,
                           straggler_words(*s.straggler).c_str())
                  : std::string("no straggler"));
  std::string compute_words = format(
      "forward+backward %.3f ms a sample on each rank against %.3f ms in the baseline (%.2fx), "
      "at a batch of %d a rank against %d",
      fb_ms, fb_base_ms, fb_base_ms > 0 ? fb_ms / fb_base_ms : 0.0, run.batch_size,
      baseline.batch_size);
  if (!host_words(s.ranks[0]).empty()) {
    compute_words += "; " + host_words(s.ranks[0]) + ", the baseline " +
                     format("%d thread%s", b.ranks[0].threads, b.ranks[0].threads == 1 ? "" : "s");
    if (oversubscribed(s.ranks[0])) compute_words += " (more threads than cores: they contend)";
  }
  if (!probe) {
    add("compute", fb, fb_base, compute_words);
  } else {
    // The probe's forward+backward per sample, at one rank's batch and threads, alone: the
    // compute of a rank without the others beside it.
    const RunSummary& p = probe->summary;
    const Breakdown& alone = *p.ranks[0].breakdown;
    const double n_probe = images_of(p);
    PARTRAIN_CHECK(n_probe > 0, UsageError, probe->path, ": the compute probe trained no image");
    const double q = (alone.forward + alone.backward) / n_probe;
    const double alone_seconds = q * per_rank_images;
    add("compute_batch", alone_seconds, fb_base,
        format("forward+backward %.3f ms a sample at a batch of %d alone (%s) against %.3f ms at "
               "%d in the baseline (%.2fx)",
               1e3 * q, probe->batch_size, probe->path.c_str(), fb_base_ms, baseline.batch_size,
               fb_base_ms > 0 ? 1e3 * q / fb_base_ms : 0.0));
    std::string contention_words = format(
        "forward+backward %.3f ms a sample on each rank beside the others against %.3f ms "
        "alone at the same batch and threads (%.2fx)",
        fb_ms, 1e3 * q, q > 0 ? fb_ms / (1e3 * q) : 0.0);
    if (!host_words(s.ranks[0]).empty()) {
      contention_words += "; " + host_words(s.ranks[0]);
      if (oversubscribed(s.ranks[0])) contention_words += " (more threads than cores)";
    }
    add_beyond("compute_contention", fb - alone_seconds, contention_words);
  }
  const std::int64_t steps = std::max<std::int64_t>(1, steps_of(s));
  const std::int64_t base_steps = std::max<std::int64_t>(1, steps_of(b));
  add("optimizer", w.optimizer, one.optimizer,
      format("the optimizer step %.2f ms, taken by every rank on the whole model, against %.2f ms "
             "in the baseline (%lld and %lld steps)",
             1e3 * w.optimizer / steps, 1e3 * one.optimizer / base_steps,
             static_cast<long long>(steps), static_cast<long long>(base_steps)));
  add("data", w.data_wait, one.data_wait,
      format("data wait %.2f s a rank against %.2f s in the baseline", w.data_wait, one.data_wait));
  add("evaluation", w.evaluation, one.evaluation,
      format("evaluation %.2f s on each rank against %.2f s in the baseline", w.evaluation,
             one.evaluation));
  add("checkpoint", w.checkpoint, one.checkpoint,
      format("checkpoints %.2f s on each rank against %.2f s in the baseline", w.checkpoint,
             one.checkpoint));
  const double startup = s.total_seconds - w.total(), base_startup = b.total_seconds - one.total();
  std::string startup_words = format(
      "start-up and the final report %.2f s (the run's %.2f s less its ranks' %.2f s of "
      "epochs) against %.2f s in the baseline",
      startup, s.total_seconds, w.total(), base_startup);
  if (s.startup && b.startup) {
    // Which phase grew: each of rank 0's against the baseline's.
    const StartupRecord& x = *s.startup;
    const StartupRecord& y = *b.startup;
    startup_words += format(
        "; joining %.2f s (%.2f), clock estimate %.2f s (%.2f), data %.2f s (%.2f), model %.2f s "
        "(%.2f), the end of the run %.2f s (%.2f)",
        x.join, y.join, x.clocks, y.clocks, x.data, y.data, x.model, y.model,
        std::max(0.0, startup - x.total()), std::max(0.0, base_startup - y.total()));
  }
  add("startup", startup, base_startup, startup_words);
  add("other", w.other, one.other,
      format("other %.2f s a rank (logging, the epochs' sums) against %.2f s in the baseline",
             w.other, one.other));
  return out;
}

Explanation explain(const RunReport& report, const TraceSummary* trace, const BenchReport* bench,
                    const RunReport* baseline, const RunReport* probe) {
  const RunSummary& s = report.summary;
  require_breakdowns(report);
  Explanation ex;
  ex.straggler = s.straggler;
  std::string& out = ex.text;
  // The table: one row per rank, each part as a share of that rank's total.
  out += "rank  train_s";
  for (const auto& [name, part] : kBreakdownParts)
    out += format(" %12s", std::string(name).c_str());
  out += "\n";
  Breakdown mean;
  for (const RankRecord& r : s.ranks) {
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

  // Who cost the others time.
  const Breakdown waiting = mean_of_the_waiting(s);
  const double wait = straggler_wait(s, waiting);
  const double waiting_total = waiting.total();
  auto pct_waiting = [&](double part) { return 100.0 * share(part, waiting_total); };
  if (s.straggler) {
    const Straggler& g = *s.straggler;
    out += format(
        "Rank %d was the straggler: the others waited %.2f s for it (%.1f%% of their training); "
        "it was %s.\n",
        g.rank, g.seconds_cost, pct_waiting(g.seconds_cost), straggler_words(g).c_str());
  } else if (s.ranks.size() > 1) {
    out += format(
        "No straggler: no rank cost the others %.0f%% of the training time more than any other "
        "rank did.\n",
        100 * 0.02);
  }

  out += describe_traffic(report, bench);
  out += describe_memory(report);

  // The speed-up against the single-device run.
  if (baseline) {
    ex.scaling = decompose_speedup(report, *baseline, probe);
    const Scaling& sc = *ex.scaling;
    out += format(
        "\nSpeed-up over the single-device run (%s): %.2fx of an ideal %.2fx (%s), on wall time "
        "per image; the training loops alone made %.2fx. The %.2fx missing:\n",
        sc.baseline.c_str(), sc.speedup, sc.ideal, sc.ideal_basis.c_str(), sc.train_speedup,
        sc.ideal - sc.speedup);
    std::vector<const ScalingPart*> order;
    for (const ScalingPart& p : sc.parts) order.push_back(&p);
    std::stable_sort(order.begin(), order.end(), [](const ScalingPart* a, const ScalingPart* b) {
      return std::fabs(a->speedup) > std::fabs(b->speedup);
    });
    double shown = 0;
    for (const ScalingPart* p : order) {
      if (std::fabs(p->speedup) < 0.005) continue;
      shown += p->speedup;
      out += format("  %-13s %+6.2fx  %s\n", p->name.c_str(), p->speedup, p->figures.c_str());
    }
    out += format("  (the parts above add up to %.2fx; each under 0.005x left out)\n", shown);
  }

  // The cause.
  const double transfer = waiting.comm_exposed - wait;
  if (ex.scaling) {
    // The parts summed by the cause they belong to (compute holds forward+backward, however
    // split, and the optimizer; other holds start-up), in the order causes first appear.
    std::vector<std::pair<std::string, double>> causes;
    for (const ScalingPart& p : ex.scaling->parts) {
      const std::string cause = cause_of_part(p.name);
      auto it = std::find_if(causes.begin(), causes.end(),
                             [&](const auto& c) { return c.first == cause; });
      if (it == causes.end()) {
        causes.emplace_back(cause, p.speedup);
      } else {
        it->second += p.speedup;
      }
    }
    const auto top =
        std::max_element(causes.begin(), causes.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    ex.cause = top->first;
    std::string parts;
    for (const ScalingPart& p : ex.scaling->parts) {
      if (cause_of_part(p.name) != ex.cause || std::fabs(p.speedup) < 0.005) continue;
      parts += format("%s%s %+.2fx", parts.empty() ? "" : ", ", p.name.c_str(), p.speedup);
    }
    ex.cause_text = format("%s costs the most of the speed-up: %.2fx of the %.2fx missing (%s)",
                           ex.cause.c_str(), top->second, ex.scaling->ideal - ex.scaling->speedup,
                           parts.c_str());
  } else {
    struct Candidate {
      const char* cause;
      double share;
      double notable;
    };
    // All read off the ranks that waited for the straggler (every rank without one): their
    // time is the run's. The straggler's own data wait is already in the others' wait for it.
    const Candidate candidates[] = {
        {"straggler", share(wait, waiting_total), 0.0},
        {"communication", share(transfer, waiting_total), kCommExposedNotable},
        {"data", share(waiting.data_wait, waiting_total), kDataWaitNotable},
        {"evaluation", share(waiting.evaluation, waiting_total), kRepeatedNotable},
        {"checkpoint", share(waiting.checkpoint, waiting_total), kRepeatedNotable},
        {"other", share(waiting.other, waiting_total), kRepeatedNotable},
    };
    const Candidate* top = nullptr;
    for (const Candidate& c : candidates) {
      if (c.share <= 0 || c.share < c.notable) continue;
      if (std::string_view(c.cause) == "straggler" && !s.straggler) continue;
      if (!top || c.share > top->share) top = &c;
    }
    if (top) {
      ex.cause = top->cause;
      ex.cause_text = format("%s takes %.1f%% of training", top->cause, 100 * top->share);
    } else {
      ex.cause = "compute";
      ex.cause_text = format("forward+backward+optimizer take %.1f%% of training", pct(compute));
    }
  }
  out += format("\nVerdict: %s (%s).\n", ex.cause.c_str(), ex.cause_text.c_str());

  // What would help, each from the figures above it, with what it would save.
  std::vector<Advice>& advice = ex.advice;
  const std::string wire = leaf(report, "comm.wire_dtype");
  const bool away = s.straggler && s.straggler->kind == "away";
  if (s.straggler) {
    const Straggler& g = *s.straggler;
    if (away) {
      advice.push_back(Advice{
          "rank_host", g.seconds_cost,
          format("Rank %d was absent for whole steps (%lld steps late by more than a median "
                 "step): something else takes its device or host in slices. Find what runs beside "
                 "it; that would save up to %.2f s (%.1f%%). Moving samples off it does not help a "
                 "rank that is absent (data.balance auto backs off), and a faster wire or "
                 "compression cannot shorten a wait for a rank that is not there.",
                 g.rank, static_cast<long long>(g.steps_away), g.seconds_cost,
                 pct_waiting(g.seconds_cost))});
    } else {
      // What it spends longer on than the others: where its lateness comes from.
      const RankRecord* slow = nullptr;
      for (const RankRecord& r : s.ranks) {
        if (r.rank == g.rank) slow = &r;
      }
      std::string_view part_name;
      double excess = 0;
      for (const auto& [name, part] : kBreakdownParts) {
        if (name != "data_wait" && name != "forward" && name != "backward" && name != "optimizer")
          continue;
        const double more = slow ? (*slow->breakdown).*part - waiting.*part : 0;
        if (more > excess) {
          excess = more;
          part_name = name;
        }
      }
      std::string where;
      if (!part_name.empty()) {
        where = format(" Its %s is %.2f s longer than the others'.", std::string(part_name).c_str(),
                       excess);
      }
      if (part_name == "data_wait") {
        where += format(
            " More loader threads (data.num_workers is %s) or a faster disk there "
            "would take that away.",
            leaf(report, "data.num_workers").c_str());
      }
      const bool auto_on = s.balance && s.balance->mode == "auto";
      advice.push_back(Advice{
          "data.balance", g.seconds_cost,
          format("Rank %d is slower at every step: balance the ranks' work or look at rank %d's "
                 "machine; removing its lateness would save up to %.2f s (%.1f%%).%s %s",
                 g.rank, g.rank, g.seconds_cost, pct_waiting(g.seconds_cost), where.c_str(),
                 auto_on ? "data.balance auto is on and left it this late: data.balance weights "
                           "can give it a smaller share."
                         : "data.balance auto (with data.global_batch_size) moves samples off a "
                           "rank that is slower at every step.")});
    }
  }
  const double busy = mean_busy_of_the_waiting(s);
  const double transfer_busy = std::max(0.0, busy - wait);
  ex.traffic = Traffic{
      waiting.comm_exposed, wait, transfer, busy,
      s.ranks.size() > 1 ? achieved_busbw_gbps(s.ranks[0], static_cast<int>(s.ranks.size())) : 0.0};
  // With a rank away for whole steps, what is left of the exposed wait after the straggler's
  // is not the wire's: a rank stopped between two buckets holds up the collective it is in, and
  // the busy time with it. No wire, backend, bucket or compression advice then.
  if (!away && share(transfer, waiting_total) >= kCommExposedNotable) {
    auto offer = [&](const std::string& action, double factor, const std::string& why) {
      const double after = predicted_transfer(transfer_busy, transfer, factor);
      const double saves = transfer - after;
      if (saves <= 0.01 * waiting_total) return;
      advice.push_back(Advice{
          action, saves,
          format("%s: exposed communication %.2f s -> %.2f s, saving %.2f s (%.1f%%) (the "
                 "collectives' busy time %.2f s scaled by %.2f, backward hiding the %.2f s it "
                 "hides now).",
                 why.c_str(), transfer, after, saves, pct_waiting(saves), transfer_busy, factor,
                 std::max(0.0, transfer_busy - transfer)),
          "communication", transfer, after});
    };
    if (wire == "f32" && !s.compression) {
      offer("comm.wire_dtype=bf16", 0.5, "comm.wire_dtype bf16 sends half the bytes");
    }
    const int world = static_cast<int>(s.ranks.size());
    double bytes = 0, buckets = 0;
    for (const RankRecord& r : s.ranks) {
      bytes += static_cast<double>(r.comm_bytes) / world;
      buckets += static_cast<double>(r.comm_buckets) / world;
    }
    if (bench && buckets > 0) {
      const double per_bucket = bytes / buckets;
      const BenchFigure* now = nearest_figure(*bench, s.env.backend, per_bucket);
      const double achieved = achieved_busbw_gbps(s.ranks[0], world);
      const double now_busbw = now ? now->busbw_gbps : achieved;
      std::string best_backend;
      double best_busbw = 0;
      for (const BenchFigure& f : bench->results) {
        if (f.backend == s.env.backend) continue;
        const BenchFigure* g = nearest_figure(*bench, f.backend, per_bucket);
        if (g && g->busbw_gbps > best_busbw) {
          best_busbw = g->busbw_gbps;
          best_backend = f.backend;
        }
      }
      if (now_busbw > 0 && best_busbw > now_busbw) {
        offer("comm.backend=" + best_backend, now_busbw / best_busbw,
              format("comm.backend %s measured %.3f GB/s against %s's %.3f GB/s at this bucket "
                     "size in %s",
                     best_backend.c_str(), best_busbw, s.env.backend.c_str(), now_busbw,
                     bench->path.c_str()));
      }
      const BenchFigure* larger = nearest_figure(*bench, s.env.backend, 4 * per_bucket);
      if (now && larger && larger->bytes > now->bytes && larger->busbw_gbps > now->busbw_gbps) {
        offer("comm.bucket_mb", now->busbw_gbps / larger->busbw_gbps,
              format("buckets 4x larger (comm.bucket_mb is %s): %s measured %.3f GB/s at %.2f MB "
                     "against %.3f GB/s at %.2f MB in %s",
                     leaf(report, "comm.bucket_mb").c_str(), s.env.backend.c_str(),
                     larger->busbw_gbps, static_cast<double>(larger->bytes) / 1e6, now->busbw_gbps,
                     static_cast<double>(now->bytes) / 1e6, bench->path.c_str()));
      }
    }
    if (!s.compression) {
      advice.push_back(Advice{
          "comm.compression=powersgd", transfer,
          format("comm.compression powersgd sends low-rank factors instead of the gradients: it "
                 "saves up to the %.2f s of exposed transfer (%.1f%%); how much depends on the "
                 "layers' shapes and powersgd_rank (bench/ddp/compression.sh measures it).",
                 transfer, pct_waiting(transfer))});
    }
    if (!bench) {
      advice.push_back(Advice{
          "bench", 0,
          "partrain bench allreduce --json on these hosts, given to explain --bench, would say "
          "what another backend or larger buckets (comm.bucket_mb is " +
              leaf(report, "comm.bucket_mb") + ") would save."});
    }
  } else if (s.straggler && share(waiting.comm_exposed, waiting_total) >= kCommExposedNotable) {
    advice.push_back(Advice{
        "none", 0,
        away ? format("Exposed communication is %.1f%% of training, %.1f%% of it measured as the "
                      "wait for rank %d; while that rank is away for whole steps the rest (%.1f%%) "
                      "holds its absences in the middle of collectives too, so a faster wire "
                      "would not help before it is back.",
                      pct_waiting(waiting.comm_exposed), pct_waiting(wait), s.straggler->rank,
                      pct_waiting(transfer))
             : format("Exposed communication is %.1f%% of training, but %.1f%% of it is the wait "
                      "for rank %d: the transfer itself is %.1f%%, so a faster wire would not help "
                      "before the straggler is fixed.",
                      pct_waiting(waiting.comm_exposed), pct_waiting(wait), s.straggler->rank,
                      pct_waiting(transfer))});
  }
  const RankRecord* hungriest = nullptr;
  for (const RankRecord& r : s.ranks) {
    if (!hungriest || share(r.breakdown->data_wait, r.breakdown->total()) >
                          share(hungriest->breakdown->data_wait, hungriest->breakdown->total())) {
      hungriest = &r;
    }
  }
  // A straggler slow for its data wait has been told so above.
  if (hungriest && !(s.straggler && !away && hungriest->rank == s.straggler->rank)) {
    const double data_share = share(hungriest->breakdown->data_wait, hungriest->breakdown->total());
    if (data_share >= kDataWaitNotable) {
      advice.push_back(Advice{
          "data.num_workers", hungriest->breakdown->data_wait,
          format("Rank %d waited for data %.1f%% of its training: more loader threads would help "
                 "(data.num_workers is %s), saving up to %.2f s.",
                 hungriest->rank, 100.0 * data_share, leaf(report, "data.num_workers").c_str(),
                 hungriest->breakdown->data_wait)});
    }
  }
  if (share(mean.optimizer, total) >= kOptimizerNotable) {
    advice.push_back(Advice{"optimizer", 0,
                            format("The optimizer takes %.1f%% of training: a fused or cheaper "
                                   "optimizer step would help.",
                                   pct(mean.optimizer))});
  }
  if (ex.scaling) {
    for (const ScalingPart& p : ex.scaling->parts) {
      if (p.speedup < 0.05 * ex.scaling->ideal) continue;
      if (p.name == "compute") {
        const RankRecord& r0 = s.ranks[0];
        if (oversubscribed(r0)) {
          advice.push_back(
              Advice{"train.threads", p.seconds,
                     format("The ranks ask for more threads than their host has cores (%s): "
                            "train.threads %d would stop them contending; compute per sample costs "
                            "%.2fx (%.2f s) of the speed-up now.",
                            host_words(r0).c_str(), std::max(1, r0.host_cores / r0.ranks_on_host),
                            p.speedup, p.seconds)});
        } else {
          advice.push_back(Advice{
              "measure", 0,
              format("Compute per sample is slower than the baseline's (%.2fx of the speed-up, "
                     "%.2f s): the smaller batch per rank or the ranks' sharing of the host's "
                     "memory and caches. partrain run CONFIG --with-baseline measures one rank's "
                     "batch alone too (OUTPUT/baseline-rank-batch), which tells the two apart.",
                     p.speedup, p.seconds)});
        }
      } else if (p.name == "compute_batch") {
        advice.push_back(Advice{
            "data.batch_size", p.seconds,
            format("Each rank computes a batch of %d, which costs more per sample than the "
                   "baseline's larger batch even alone (%s): %.2fx of the speed-up, %.2f s. A "
                   "larger batch per rank (data.batch_size, or data.global_batch_size) would win "
                   "most of it back.",
                   report.batch_size, p.figures.c_str(), p.speedup, p.seconds)});
      } else if (p.name == "compute_contention") {
        const RankRecord& r0 = s.ranks[0];
        advice.push_back(Advice{
            oversubscribed(r0) ? "train.threads" : "ranks_per_host", p.seconds,
            format("The ranks slow each other down on the host (%s): %.2fx of the speed-up, "
                   "%.2f s. %s",
                   p.figures.c_str(), p.speedup, p.seconds,
                   oversubscribed(r0)
                       ? format("They ask for more threads than there are cores: train.threads "
                                "%d would stop them contending.",
                                std::max(1, r0.host_cores / r0.ranks_on_host))
                             .c_str()
                       : "They share the host's memory bandwidth and caches: ranks on more hosts "
                         "(or devices), not more ranks on this one, would take it away.")});
      } else if (p.name == "optimizer") {
        advice.push_back(Advice{
            "data.batch_size", 0,
            format("Every rank takes the whole optimizer step (%.2fx of the speed-up, %.2f s): "
                   "larger batches per rank take it less often per image.",
                   p.speedup, p.seconds)});
      } else if (p.name == "evaluation" || p.name == "startup" || p.name == "checkpoint") {
        advice.push_back(Advice{
            "none", 0,
            format("%s costs %.2fx of the speed-up (%.2f s) that more devices do not shorten: a "
                   "longer run spreads it over more images.",
                   p.name.c_str(), p.speedup, p.seconds)});
      }
    }
  }
  if (advice.empty()) {
    advice.push_back(Advice{
        "none", 0,
        format("Nothing beside the computation stands out: forward+backward+optimizer are "
               "%.1f%%, so a faster device or a smaller model is what would speed this run up.",
               pct(compute))});
  }
  for (const Advice& a : advice) out += a.text + "\n";

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
  return ex;
}

nlohmann::ordered_json explanation_to_json(const Explanation& ex, const RunReport& report) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["schema"] = "partrain.explain/1";
  j["report"] = report.path;
  j["verdict"] = Json{{"cause", ex.cause}, {"text", ex.cause_text}};
  if (ex.straggler) {
    j["straggler"] = straggler_to_json(ex.straggler);
  } else {
    j["straggler"] = nullptr;
  }
  j["communication"] = Json{{"exposed_seconds", ex.traffic.exposed_seconds},
                            {"straggler_wait_seconds", ex.traffic.straggler_wait_seconds},
                            {"transfer_seconds", ex.traffic.transfer_seconds},
                            {"busy_seconds", ex.traffic.busy_seconds},
                            {"busbw_gbps", ex.traffic.busbw_gbps}};
  if (ex.scaling) {
    const Scaling& sc = *ex.scaling;
    Json parts = Json::object(), figures = Json::object(), seconds = Json::object();
    for (const ScalingPart& p : sc.parts) {
      parts[p.name] = p.speedup;
      seconds[p.name] = p.seconds;
      figures[p.name] = p.figures;
    }
    j["scaling"] = Json{{"baseline", sc.baseline},
                        {"speedup", sc.speedup},
                        {"train_speedup", sc.train_speedup},
                        {"ideal", sc.ideal},
                        {"ideal_basis", sc.ideal_basis},
                        {"gap", sc.ideal - sc.speedup},
                        {"parts", parts},
                        {"seconds", seconds},
                        {"figures", figures}};
  } else {
    j["scaling"] = nullptr;
  }
  Json advice = Json::array();
  for (const Advice& a : ex.advice) {
    Json one{{"action", a.action}, {"saves_seconds", a.saves_seconds}, {"text", a.text}};
    if (!a.part.empty()) {
      one["predicted"] = Json{
          {"part", a.part}, {"now_seconds", a.now_seconds}, {"after_seconds", a.after_seconds}};
    }
    advice.push_back(one);
  }
  j["advice"] = advice;
  Json memory = nullptr;
  for (const RankRecord& r : report.summary.ranks) {
    if (!r.memory) {
      memory = nullptr;
      break;
    }
    if (memory.is_null()) memory = Json::array();
    Json rank{{"rank", r.rank}, {"peak_mb", r.peak_rss_mb}};
    for (const auto& [name, part] : kMemoryParts) rank[std::string(name)] = (*r.memory).*part;
    memory.push_back(rank);
  }
  j["memory"] = memory;
  return j;
}

}  // namespace partrain
