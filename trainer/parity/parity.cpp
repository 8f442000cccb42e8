#include "trainer/parity/parity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "trainer/parity/figure_format.h"

namespace partrain::parity {
namespace {

// Band edges are inclusive; this much relative slack keeps a ratio that is exactly at the
// edge in decimal (0.8 = 1.2 / 1.5) from falling out through binary rounding.
constexpr double kEdgeSlack = 1e-9;

// Config keys that differ between a single run and its parallel twin by design. Anything
// else that differs makes the comparison about more than parallelism, and is warned about.
// data.batch_size is per rank: the total batch is compared on its own.
bool differs_by_design(const std::string& key) {
  static const std::vector<std::string> kPrefixes = {"launch.", "comm.", "output.", "checkpoint."};
  static const std::set<std::string> kKeys = {"name",   "strategy", "reference",
                                              "source", "output",   "data.batch_size"};
  if (kKeys.count(key)) return true;
  return std::any_of(kPrefixes.begin(), kPrefixes.end(),
                     [&](const std::string& p) { return key.rfind(p, 0) == 0; });
}

std::string leaf(const RunReport& report, const std::string& key) {
  auto it = report.config_leaves.find(key);
  return it == report.config_leaves.end() ? "(absent)" : it->second;
}

std::string role_of(const RunReport& report) {
  if (report.summary.env.strategy == "single") {
    PARTRAIN_CHECK(report.summary.env.world_size == 1, UsageError, report.path,
                   ": env.world_size is ", report.summary.env.world_size,
                   " for strategy single: a single-device run has world_size 1");
    return "single";
  }
  if (report.summary.env.strategy == "ddp") {
    PARTRAIN_CHECK(report.summary.env.world_size >= 2, UsageError, report.path,
                   ": env.world_size is ", report.summary.env.world_size,
                   " for strategy ddp: a parallel run needs at least 2 ranks");
    return "ddp";
  }
  if (report.summary.env.strategy == "dp") {
    PARTRAIN_CHECK(report.summary.env.devices.size() >= 2, UsageError, report.path,
                   ": env.devices has ", report.summary.env.devices.size(),
                   " entries for strategy dp: DataParallel needs at least 2 devices");
    return "dp";
  }
  throw UsageError(detail::concat(report.path, ": env.strategy is \"", report.summary.env.strategy,
                                  "\", expected single, ddp or dp"));
}

RunSummary summarise(const RunReport& report, const std::string& role) {
  RunSummary s;
  s.role = role;
  s.path = report.path;
  // ddp: one rank per device; dp: one process drives env.devices.
  s.devices = role == "dp" ? static_cast<int>(report.summary.env.devices.size())
                           : report.summary.env.world_size;
  s.device_kind = report.summary.env.devices[0].substr(0, report.summary.env.devices[0].find(':'));
  s.backend = report.summary.env.backend;
  s.batch_size_per_rank = report.batch_size;
  s.total_batch =
      role == "ddp" ? report.batch_size * report.summary.env.world_size : report.batch_size;
  s.num_workers = report.num_workers;
  s.epochs_run = static_cast<int>(report.summary.epochs.size());
  double sum = 0.0;
  for (const auto& e : report.summary.epochs) sum += e.seconds;
  s.mean_epoch_seconds = sum / static_cast<double>(report.summary.epochs.size());
  s.images_per_s = report.summary.images_per_s;
  // A diverged run's accuracy is NaN (null in the file): no figure rather than a NaN one.
  const double accuracy = report.summary.epochs.back().test_accuracy;
  if (!std::isnan(accuracy)) s.final_test_accuracy = accuracy;
  return s;
}

// Device memory per rank from the best source both runs have: what the CUDA caching
// allocator reserved (closest to what nvidia-smi shows), else what it allocated, else, on
// CPU, the process's peak RSS.
void take_memory(const RunReport& a, RunSummary& sa, const RunReport& b, RunSummary& sb) {
  auto all_have = [](const RunReport& r, std::optional<double> RankRecord::*field) {
    return std::all_of(r.summary.ranks.begin(), r.summary.ranks.end(),
                       [&](const RankRecord& f) { return (f.*field).has_value(); });
  };
  std::optional<double> RankRecord::*cuda_field = nullptr;
  if (all_have(a, &RankRecord::cuda_peak_reserved_mb) &&
      all_have(b, &RankRecord::cuda_peak_reserved_mb)) {
    cuda_field = &RankRecord::cuda_peak_reserved_mb;
    sa.memory_source = sb.memory_source = "cuda_peak_reserved_mb";
  } else if (all_have(a, &RankRecord::cuda_peak_allocated_mb) &&
             all_have(b, &RankRecord::cuda_peak_allocated_mb)) {
    cuda_field = &RankRecord::cuda_peak_allocated_mb;
    sa.memory_source = sb.memory_source = "cuda_peak_allocated_mb";
  } else {
    sa.memory_source = sb.memory_source = "peak_rss_mb";
  }
  for (auto [report, summary] : {std::pair{&a, &sa}, std::pair{&b, &sb}}) {
    std::vector<RankRecord> ranks = report->summary.ranks;
    std::sort(ranks.begin(), ranks.end(),
              [](const RankRecord& x, const RankRecord& y) { return x.rank < y.rank; });
    for (const auto& r : ranks)
      summary->memory_mb.push_back(cuda_field ? *(r.*cuda_field) : r.peak_rss_mb);
  }
}

Figure make_figure(const Reference& ref, std::string id, std::string label, std::string unit,
                   std::optional<double> ours, std::optional<double> theirs) {
  Figure f;
  f.label = std::move(label);
  f.unit = std::move(unit);
  f.ours = ours;
  f.reference = theirs;
  if (ours && theirs && *theirs > 0.0) f.ratio = *ours / *theirs;
  auto tol = ref.tolerance.find(id);
  f.id = std::move(id);
  if (tol != ref.tolerance.end() && f.ratio) {
    f.tolerance = tol->second;
    const bool above_min = !tol->second.min || *f.ratio >= *tol->second.min * (1.0 - kEdgeSlack);
    const bool below_max = !tol->second.max || *f.ratio <= *tol->second.max * (1.0 + kEdgeSlack);
    f.verdict = above_min && below_max ? Verdict::kWithin : Verdict::kOutside;
  }
  return f;
}

void warn_about_pair(const RunReport& single, const RunReport& parallel, const ParityResult& result,
                     std::vector<std::string>& warnings) {
  const std::string role = result.parallel.role;
  if (result.single.total_batch != result.parallel.total_batch) {
    warnings.push_back(detail::concat("the total batch differs: ", result.single.total_batch,
                                      " (single) vs ", result.parallel.total_batch, " (", role,
                                      ", ", result.parallel.batch_size_per_rank,
                                      " per rank): the speed-up is not at equal total batch"));
  }
  std::set<std::string> keys;
  for (const auto& [k, v] : single.config_leaves) keys.insert(k);
  for (const auto& [k, v] : parallel.config_leaves) keys.insert(k);
  for (const auto& key : keys) {
    if (differs_by_design(key)) continue;
    const std::string a = leaf(single, key), b = leaf(parallel, key);
    if (a == b) continue;
    std::string message = detail::concat("the runs differ besides parallelism: ", key, " is ", a,
                                         " (single) vs ", b, " (", role, ")");
    const Reference& ref = result.reference;
    if (key == "data.num_workers" && ref.single.num_workers && ref.parallel.num_workers &&
        *ref.single.num_workers != *ref.parallel.num_workers) {
      message += detail::concat("; the reference pair differed here too (", *ref.single.num_workers,
                                " vs ", *ref.parallel.num_workers, ")");
    }
    warnings.push_back(message);
  }
  if (single.summary.env.os != parallel.summary.env.os) {
    warnings.push_back(detail::concat("the runs ran on different systems: ", single.summary.env.os,
                                      " (single) vs ", parallel.summary.env.os, " (", role, ")"));
  }
  if (result.single.device_kind != result.parallel.device_kind) {
    warnings.push_back(
        detail::concat("the runs used different devices: ", result.single.device_kind,
                       " (single) vs ", result.parallel.device_kind, " (", role, ")"));
  }
  if (result.single.epochs_run != result.parallel.epochs_run) {
    warnings.push_back(
        detail::concat("the runs finished different numbers of epochs: ", result.single.epochs_run,
                       " (single) vs ", result.parallel.epochs_run, " (", role,
                       "); times are compared per epoch"));
  }
}

void warn_about_reference(const RunReport& single, const ParityResult& result,
                          std::vector<std::string>& warnings) {
  const Reference& ref = result.reference;
  if (ref.epochs && single.epochs_configured != *ref.epochs) {
    warnings.push_back(detail::concat("the runs train ", single.epochs_configured,
                                      " epochs, the reference ", *ref.epochs));
  }
  if (!ref.dataset.empty() && single.dataset != ref.dataset) {
    warnings.push_back(detail::concat("the runs use the dataset ", single.dataset,
                                      ", the reference ", ref.dataset));
  }
  const std::string limit = leaf(single, "data.train_limit");
  if (limit != "(absent)" && limit != "0") {
    warnings.push_back("the runs use only the first " + limit + " training samples" +
                       (ref.dataset.empty() ? "" : ", the reference all of " + ref.dataset));
  }
  const std::string model = leaf(single, "model.name");
  if (!ref.model.empty() && model != "(absent)" && model != ref.model) {
    warnings.push_back(
        detail::concat("the runs train the model ", model, ", the reference ", ref.model));
  }
  if (result.parallel.devices != ref.parallel.devices) {
    warnings.push_back(detail::concat("the parallel run uses ", result.parallel.devices,
                                      " devices, the reference ", ref.parallel.devices,
                                      ": speed-up and efficiency scale with the device count"));
  }
}

std::string describe_memory(const std::string& source) {
  if (source == "cuda_peak_reserved_mb") return "peak bytes reserved by the CUDA caching allocator";
  if (source == "cuda_peak_allocated_mb")
    return "peak bytes allocated by the CUDA caching allocator";
  return "peak resident set size (RSS) of each rank's process";
}

}  // namespace

ParityResult compare(const std::vector<std::string>& report_paths,
                     const std::string& reference_path) {
  ParityResult result;
  result.reference = load_reference(reference_path);
  const Reference& ref = result.reference;
  const std::string wanted = ref.parallel.strategy;

  std::optional<RunReport> single, parallel, extra;
  std::string extra_role;
  for (const auto& path : report_paths) {
    RunReport report = read_run_report(path);
    const std::string role = role_of(report);
    std::optional<RunReport>* slot = role == "single" ? &single
                                     : role == wanted ? &parallel
                                                      : &extra;
    if (*slot) {
      throw UsageError(detail::concat(path, ": a second ", role, " run (the first is ",
                                      (*slot)->path, "); pass one report of each kind"));
    }
    if (slot == &extra) extra_role = role;
    *slot = std::move(report);
  }
  PARTRAIN_CHECK(single, UsageError,
                 "no single-device run among the reports (env.strategy single, world_size 1); "
                 "parity needs one beside the parallel run");
  PARTRAIN_CHECK(parallel, UsageError, "no ", wanted, " run among the reports, and the reference ",
                 ref.path, " compares a ", wanted, " run");

  result.single = summarise(*single, "single");
  result.parallel = summarise(*parallel, wanted);
  take_memory(*single, result.single, *parallel, result.parallel);
  if (extra) result.extra = summarise(*extra, extra_role);

  const RunSummary& s = result.single;
  const RunSummary& p = result.parallel;
  std::optional<double> ref_single_epoch, ref_parallel_epoch, ref_single_tput, ref_parallel_tput;
  if (ref.epochs && ref.single.seconds) ref_single_epoch = *ref.single.seconds / *ref.epochs;
  if (ref.epochs && ref.parallel.seconds) ref_parallel_epoch = *ref.parallel.seconds / *ref.epochs;
  if (ref.train_images && ref_single_epoch) {
    ref_single_tput = static_cast<double>(*ref.train_images) / *ref_single_epoch;
  }
  if (ref.train_images && ref_parallel_epoch) {
    ref_parallel_tput =
        static_cast<double>(*ref.train_images) / *ref_parallel_epoch / ref.parallel.devices;
  }

  auto& figs = result.figures;
  figs.push_back(
      make_figure(ref, "", "Epoch time, single", "s", s.mean_epoch_seconds, ref_single_epoch));
  figs.push_back(
      make_figure(ref, "", "Epoch time, " + wanted, "s", p.mean_epoch_seconds, ref_parallel_epoch));
  figs.push_back(make_figure(ref, kSpeedup,
                             "Speed-up at equal total batch (single / " + wanted + " time)", "x",
                             s.mean_epoch_seconds / p.mean_epoch_seconds, ref.speedup));
  figs.push_back(make_figure(ref, "", "Throughput per device, single", "img/s", s.images_per_s,
                             ref_single_tput));
  const double our_parallel_tput = p.images_per_s / p.devices;
  figs.push_back(make_figure(ref, "", "Throughput per device, " + wanted, "img/s",
                             our_parallel_tput, ref_parallel_tput));
  std::optional<double> our_efficiency;
  if (s.images_per_s > 0.0) our_efficiency = our_parallel_tput / s.images_per_s;
  figs.push_back(make_figure(ref, kEfficiency,
                             "Scaling efficiency (" + wanted + " throughput per device / single)",
                             "", our_efficiency, *ref.speedup / ref.parallel.devices));

  const double single_mb = s.memory_mb.empty() ? 0.0 : s.memory_mb[0];
  if (single_mb > 0.0) {
    std::vector<double> ratios;
    for (double mb : p.memory_mb) ratios.push_back(mb / single_mb);
    const bool per_device = static_cast<int>(p.memory_mb.size()) == p.devices;
    for (std::size_t r = 0; r < ratios.size(); ++r) {
      std::optional<double> theirs;
      if (per_device && r < ref.memory_ratio.size()) theirs = ref.memory_ratio[r];
      const std::string who = per_device ? "device " + std::to_string(r) : "process";
      figs.push_back(make_figure(ref, "", "Memory, " + wanted + " " + who + " / single", "",
                                 ratios[r], theirs));
    }
    std::optional<double> ref_largest, ref_balance = ref.balance;
    if (!ref.memory_ratio.empty()) {
      ref_largest = *std::max_element(ref.memory_ratio.begin(), ref.memory_ratio.end());
    }
    figs.push_back(make_figure(ref, kMemoryRatio, "Memory, largest " + wanted + " device / single",
                               "", *std::max_element(ratios.begin(), ratios.end()), ref_largest));
    if (per_device && ratios.size() >= 2) {
      const auto [lo, hi] = std::minmax_element(p.memory_mb.begin(), p.memory_mb.end());
      figs.push_back(make_figure(ref, kBalance, "Balance across devices (min / max memory)", "",
                                 *lo / *hi, ref_balance));
    }
  }
  if (result.extra) {
    const RunSummary& x = *result.extra;
    figs.push_back(
        make_figure(ref, "", "Epoch time, " + x.role, "s", x.mean_epoch_seconds, std::nullopt));
    figs.push_back(make_figure(ref, "", "Speed-up of " + x.role + " (single / " + x.role + " time)",
                               "x", s.mean_epoch_seconds / x.mean_epoch_seconds, std::nullopt));
  }
  if (s.final_test_accuracy) {
    figs.push_back(make_figure(ref, "", "Final test accuracy, single", "", s.final_test_accuracy,
                               std::nullopt));
  }
  if (p.final_test_accuracy) {
    figs.push_back(make_figure(ref, "", "Final test accuracy, " + wanted, "", p.final_test_accuracy,
                               std::nullopt));
  }
  // A tolerance the figures could not be held against is said out loud, not passed silently.
  for (const auto& [id, tol] : ref.tolerance) {
    const bool checked = std::any_of(figs.begin(), figs.end(), [&, &id = id](const Figure& f) {
      return f.id == id && f.verdict != Verdict::kInfo;
    });
    if (!checked) {
      result.warnings.push_back("tolerance." + id +
                                " was not checked: the runs do not give that figure");
    }
  }

  warn_about_pair(*single, *parallel, result, result.warnings);
  warn_about_reference(*single, result, result.warnings);
  if (result.extra && result.extra->total_batch != s.total_batch) {
    result.warnings.push_back(detail::concat(
        "the total batch of the ", result.extra->role, " run (", result.extra->total_batch,
        ") differs from the single run's (", s.total_batch, ")"));
  }

  result.notes.push_back(
      "Times are mean epoch seconds (report epochs[].seconds); throughput is "
      "the report's images_per_s, divided by the number of devices.");
  std::string memory_note =
      "Memory (ours) is the " + describe_memory(s.memory_source) + ", on " + s.device_kind + ".";
  if (!ref.parallel.memory_mb.empty() || !ref.memory_ratio.empty()) {
    memory_note += " Memory (reference) is device memory as " +
                   (ref.memory_source.empty() ? std::string("the experiment reported it")
                                              : ref.memory_source + " reported it") +
                   ", which also counts the CUDA context and the allocator's cached blocks.";
  }
  result.notes.push_back(memory_note);
  if (!ref.note.empty()) result.notes.push_back("Reference note: " + ref.note);
  return result;
}

int exit_code(const ParityResult& result) {
  for (const auto& f : result.figures) {
    if (f.verdict == Verdict::kOutside) return 1;
  }
  return 0;
}

void write_parity_outputs(const ParityResult& result, const std::string& markdown_path,
                          const std::string& svg_path) {
  if (!markdown_path.empty()) write_file_atomically(markdown_path, to_markdown(result));
  if (!svg_path.empty()) write_file_atomically(svg_path, to_svg(result));
}

}  // namespace partrain::parity
