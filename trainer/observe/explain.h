// defines: explain() and explain_run() — what `partrain explain` says of a report: a table of
// each rank's breakdown as shares of its training time, then where the time went, which rank
// (if any) cost the others time and how it is slow, how fast the gradients travelled, and,
// given the single-device run of the same config, the speed-up decomposed: the ideal, the
// measured, and the parts of the gap in speed-up units. Then the advice that follows from
// the cause, each with what it would save. Every claim names the figure it rests on.
// explanation_to_json() is `explain --json`. LibTorch-free.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "trainer/observe/trace_format.h"
#include "trainer/report/report_reader.h"

namespace partrain {

// Shares from which a part is called out (of the mean rank's training time).
inline constexpr double kCommExposedNotable = 0.15;
inline constexpr double kDataWaitNotable = 0.10;
inline constexpr double kOptimizerNotable = 0.15;
inline constexpr double kRepeatedNotable = 0.10;  // evaluation, checkpoint, other

// What `partrain bench allreduce --json` measured (its partrain.bench/1 file): the busbw of
// each backend and size, to hold the training's gradient allreduces against.
struct BenchFigure {
  std::string backend;
  std::int64_t bytes = 0;
  double busbw_gbps = 0;
};
struct BenchReport {
  std::string path;
  int world = 0;
  std::string wire_dtype;
  std::vector<BenchFigure> results;
};
// A missing or ill-typed field, or another schema, is a UsageError naming the file.
BenchReport read_bench_report(const std::string& path);

// The busbw a rank's gradient collectives achieved: the ring's 2(W-1)/W of the bytes it handed
// to them, over the time its communication thread spent in them; 0 without either.
double achieved_busbw_gbps(const RankRecord& rank, int world_size);

// The speed-up of a parallel run over its single-device baseline, on wall time per training
// image (the whole run: start-up, evaluation and checkpoints included), and the gap to the
// ideal cut into parts. With t the wall seconds per image of the parallel run, t1 the
// baseline's, I the ideal and x_k, y_k each part's seconds per image in the two runs, the
// speed-up is t1 / t and t = t1 / I + sum_k (x_k - y_k / I); part k's share of the gap is
// I (x_k - y_k / I) / t, and the shares add up to I - t1 / t exactly. A part is negative where
// the parallel run spent less on it than its share of the baseline's.
struct ScalingPart {
  std::string name;     // communication, straggler, compute (or, given the compute probe,
                        // compute_batch and compute_contention), optimizer, data, evaluation,
                        // checkpoint, startup, other
  double speedup = 0;   // of the gap, in speed-up units
  double seconds = 0;   // what it cost the parallel run's wall time beyond the ideal
  std::string figures;  // the measured figures it rests on, in words
};
struct Scaling {
  std::string baseline;      // its report's path
  double speedup = 0;        // wall time per image: baseline over this run
  double train_speedup = 0;  // images/s of the training loops alone
  double ideal = 0;
  std::string ideal_basis;  // what makes it ideal, in words
  std::vector<ScalingPart> parts;
};

// The parallel run and its baseline decomposed (above). UsageError naming the files when the
// baseline is not a one-process run of the same model and data, or either lacks a breakdown.
// `probe`, when given, is one process at one rank's batch and threads, alone on the host (what
// `partrain run --with-baseline` leaves in OUTPUT/baseline-rank-batch): its forward+backward
// per sample q splits the compute part in two that add up to it: compute_batch, the probe
// against the baseline (the smaller batch per rank), and compute_contention, the run against
// the probe (the ranks beside each other on the host's cores, memory and caches). A probe of
// another batch, model or data is a UsageError naming it.
Scaling decompose_speedup(const RunReport& run, const RunReport& baseline,
                          const RunReport* probe = nullptr);

// One suggestion: the setting or action, what it would save (seconds of wall time; 0 where
// the report cannot say) and the sentence. Where it predicts what one measured part becomes
// (the exposed transfer, for a wire, backend or bucket size), `part` names it with its
// seconds now and after: a run made that way can be held against `after_seconds`.
struct Advice {
  std::string action;
  double saves_seconds = 0;
  std::string text;
  std::string part = {};
  double now_seconds = 0;
  double after_seconds = 0;
};

// The gradient traffic as the ranks that waited saw it (all ranks without a straggler), in
// seconds a rank over the run: the wait for gradients after backward (`exposed`), the part of
// it spent waiting for the straggler, the rest (`transfer`, what a faster wire shortens), the
// time the communication thread spent in the collectives, and the busbw that made.
struct Traffic {
  double exposed_seconds = 0;
  double straggler_wait_seconds = 0;
  double transfer_seconds = 0;
  double busy_seconds = 0;
  double busbw_gbps = 0;
};

struct Explanation {
  // compute, communication, straggler, data, evaluation, checkpoint or other
  std::string cause;
  std::string cause_text;
  std::optional<Straggler> straggler;
  std::optional<Scaling> scaling;
  Traffic traffic;
  std::vector<Advice> advice;
  std::string text;  // what `partrain explain` prints
};

// trace: the run's trace summary, or null; bench: a bench allreduce report, or null; baseline:
// the single-device run of the same config, or null; probe: the compute probe (above), or null,
// used only with a baseline. Throws UsageError naming the report when a rank has no breakdown
// (a report written before partrain recorded one).
Explanation explain(const RunReport& report, const TraceSummary* trace,
                    const BenchReport* bench = nullptr, const RunReport* baseline = nullptr,
                    const RunReport* probe = nullptr);

inline std::string explain_run(const RunReport& report, const TraceSummary* trace,
                               const BenchReport* bench = nullptr,
                               const RunReport* baseline = nullptr,
                               const RunReport* probe = nullptr) {
  return explain(report, trace, bench, baseline, probe).text;
}

// `explain --json`: {"schema": "partrain.explain/1", "report", "verdict": {"cause", "text"},
// "straggler": null or {...}, "communication": {"exposed_seconds", "straggler_wait_seconds",
// "transfer_seconds", "busy_seconds", "busbw_gbps"}, "scaling": null or {"speedup",
// "train_speedup", "ideal", "gap", "parts": {name: speed-up units}, "figures": {name: words},
// ...}, "advice": [{"action", "saves_seconds", "text", and with a prediction "predicted":
// {"part", "now_seconds", "after_seconds"}}]}.
nlohmann::ordered_json explanation_to_json(const Explanation& explanation, const RunReport& report);

}  // namespace partrain
