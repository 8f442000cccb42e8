// defines: weighted_shares(), speed_shares(), predicted_step_seconds() and AutoBalance — how a
// micro-step's M samples are split over ranks of unequal speed (data.balance), and when `auto`
// changes that split. LibTorch-free.
//
// A split is a vector of shares b_0 .. b_{W-1} summing to M, each >= 1 (what BatchPlan takes).
// Shares only change how each micro-step is cut, never which samples it holds, so a split may
// change between any two optimizer steps and the run still sees the same samples in the same
// groups (batch_plan.h); the gradient stays the mean over all M (Strategy::set_rank_share).
//
// auto: each rank measures, each step, its busy seconds per sample: the wall time of its own
// work (data wait, forward, backward and optimizer, not its waits at the collectives) net of
// the times the process was stopped from outside (trainer/observe/stall_meter.h), plus the
// stops no longer than that work, wherever they land, over its samples. A stop that lands in a
// wait at the gradient allreduce holds every other rank up as well: compute timers alone do
// not see it, and a rank of a small share, computing between two stops and waiting through
// them, would look as fast as any. A stop longer than the work is an absence for whole steps,
// which no share shortens: it stays out (EpochLoop::measure_speed).
// A step takes about max_r b_r * s_r, which is smallest when b_r is proportional to the speed
// 1 / s_r. Work of a fixed size a step (the optimizer) counts per sample too: a rank of a small
// share then measures slower per sample, and the split settles where the ranks' busy times
// are equal, which is the aim. Each rank also reports the fraction of the step it was not
// stopped, for the record. Each window of steps updates a running estimate per rank. The
// first change goes to the speed split (a fresh run has nothing better to go by); later ones
// move half way from the current split to it, so that one odd window does not swing it (and
// the fixed work, which grows per sample as a share shrinks, is approached rather than
// chased). Every rank runs the same AutoBalance on the same numbers, so all
// of them switch at the same step.
//
// A move is a prediction; the steps after it are the measurement. Rank 0's wall time of each
// step (the same for every rank: the gradient allreduce ends the step on all of them) comes
// with the figures. Every move is judged: the mean step over a span after it (at least
// judge_windows windows and judge_seconds of steps, so that a rank away for whole steps in
// slices shows in it as it does in the run's speed) is held against the mean over the steps
// since the previous change, which must cover as long a span before a move is made. If the
// steps were not faster (by judged_gain, 1 %), the move is undone: the split goes back, the
// estimates start afresh, and the next windows only measure, twice as many after each undo in a
// row, so that where no split makes the steps faster the tries die out. A span whose noise promised
// a gain that the ranks do not deliver costs one span, not the rest of the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace partrain::data {

// M split in proportion to `weights` (each > 0), rounded by largest remainder so that the
// shares sum to M exactly: each rank first gets floor(M * w_r / sum w); the samples left go one
// each to the largest fractional parts, ties to the lower rank. Throws UsageError (the message
// names the numbers, not the key: the caller knows where the weights came from) when a weight
// is not a positive finite number, when there are none, or when a share rounds to 0.
std::vector<std::int64_t> weighted_shares(std::int64_t micro_batch,
                                          const std::vector<double>& weights);

// n split in proportion to `weights` (each > 0) by largest remainder, as weighted_shares(), but
// a share may round to 0 (strategy dp's pieces of a batch smaller than its devices).
std::vector<std::int64_t> proportional_split(std::int64_t n, const std::vector<double>& weights);

// M split in proportion to the speeds 1 / seconds_per_sample[r], every rank keeping at least
// one sample (a rank too slow for its rounded share still takes 1, from the largest share).
// Each time must be > 0 and finite; M >= W. Throws UsageError otherwise.
std::vector<std::int64_t> speed_shares(std::int64_t micro_batch,
                                       const std::vector<double>& seconds_per_sample);

// The time of a step that splits M as `shares`: the slowest rank's b_r * s_r.
double predicted_step_seconds(const std::vector<std::int64_t>& shares,
                              const std::vector<double>& seconds_per_sample);

struct AutoBalanceOptions {
  // Steps at the start whose figures are not used (the first steps allocate); after a change
  // one step is skipped too (the loader rebuilds its look-ahead).
  int warmup_steps = 3;
  // Steps measured per decision; also the fewest steps between two changes, which bounds how
  // often the split can move.
  int window_steps = 5;
  // The split moves only when the speed split would shorten the predicted step by more than
  // this fraction (twice it for the first move, which goes all the way): measurement noise
  // must not move it back and forth.
  double min_gain = 0.05;
  // Weight of the newest window in each rank's running estimate (1: that window alone). A rank
  // slowed from outside (stopped part of the time) measures noisily over a few steps.
  double smoothing = 0.5;
  // Windows after an undone move that only measure (they make fresh estimates); bounds how often
  // a move can be tried and taken back. Each undo in a row doubles them, up to the cap, so
  // where no split makes the steps faster (a rank away in slices) the tries die out.
  int windows_after_undo = 2;
  int max_windows_after_undo = 256;
  // The span a move is judged on, after it, and measured on before it: at least this many
  // windows of steps and this many seconds of them. Steps of a few milliseconds beside a rank
  // stopped for tens of milliseconds at a time need the seconds; long steps the windows.
  int judge_windows = 2;
  double judge_seconds = 0.5;
  // A move is kept only when the mean step after it is at least this fraction faster: one that
  // gains less is noise, and taking it back costs nothing.
  double judged_gain = 0.01;
  // A step longer than this many times the span's median is left out of its mean (a pause of
  // the whole machine); a rank stopped for a whole step makes a step a few times the median,
  // which stays in.
  double outlier_factor = 20.0;
};

// One change of the split, for the log line and report.json.
struct BalanceChange {
  std::int64_t step = 0;  // the optimizer steps taken when it was decided
  std::vector<std::int64_t> shares;
  // Each rank's running estimates it was decided on: busy seconds per sample, and the
  // fraction of the time it ran (1: never stopped from outside; not used in the decision).
  std::vector<double> seconds_per_sample;
  std::vector<double> running;
  double predicted_before = 0;  // seconds of a step's busiest rank, old split
  double predicted_after = 0;   // and new split
  // Measured: the mean wall seconds of a step (rank 0's clock) since the previous change, under
  // the split it leaves; 0 when not measured.
  double step_seconds = 0;
  // An undo takes the previous move back, because the steps under it (step_seconds, over the
  // span it was judged on) were no faster than the steps before it (before_move_seconds, the
  // move's own step_seconds).
  bool undo = false;
  double before_move_seconds = 0;
};

// "step 8: shares 171,85 (busy s/sample 0.00047,0.00047; running 100%,50%; predicted step
// 0.12 s -> 0.08 s; steps took 0.121 s)"; an undo: "step 14: back to shares 128,128 (steps
// took 0.13 s after the move, 0.121 s before it; busy s/sample ...)".
std::string describe(const BalanceChange& change);

class AutoBalance {
 public:
  AutoBalance(std::vector<std::int64_t> shares, AutoBalanceOptions options = {});

  // After optimizer step `step`: each rank's busy seconds per sample over it (0 for a rank
  // that measured nothing, e.g. no sample), the fraction of the step it ran (in [0, 1];
  // empty: all ran the whole time; recorded only) and the step's wall seconds (0: unknown;
  // then moves wait for no span and are not judged). Returns the change when the split moves
  // or a move is undone; then
  // shares() is the new split from the next step on. Deterministic in its inputs.
  std::optional<BalanceChange> observe(std::int64_t step,
                                       const std::vector<double>& seconds_per_sample,
                                       const std::vector<double>& running = {},
                                       double step_seconds = 0);

  const std::vector<std::int64_t>& shares() const { return shares_; }

 private:
  // The split from the next step on; that step is not measured (the loader rebuilds its
  // look-ahead), unless there is no warm-up at all.
  void switch_to(const std::vector<std::int64_t>& shares);

  std::vector<std::int64_t> shares_;
  AutoBalanceOptions options_;
  int skip_ = 0;        // warm-up steps still to ignore
  bool moved_ = false;  // whether the split has moved yet
  int measured_ = 0;
  // Whether `steps` (wall seconds) cover the span a move is judged on.
  bool spans_enough(const std::vector<double>& steps) const;

  int quiet_windows_ = 0;    // windows still to only measure (after an undo)
  int undone_in_a_row_ = 0;  // moves taken back since the last one that was kept
  // The move not judged yet: what to go back to, the mean step before it, whether it was the
  // first, and the wall seconds of the steps since.
  struct Trial {
    std::vector<std::int64_t> shares_before;
    double step_seconds_before = 0;
    bool first = false;
    std::vector<double> steps_after;
  };
  std::optional<Trial> trial_;
  std::vector<double> steps_since_change_;  // wall seconds of the steps since the last change
  std::vector<double> sums_;                // busy seconds per sample, over the window
  std::vector<double> running_sums_;        // fractions of the time run, over the window
  std::vector<double> estimates_;           // empty until the first window
  std::vector<double> running_;             // likewise (for the record)
};

}  // namespace partrain::data
