#include "trainer/data/balance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "common/errors.h"

namespace partrain::data {

namespace {

std::string joined(const std::vector<double>& values, const char* format) {
  std::string text;
  char buf[64];
  for (double v : values) {
    std::snprintf(buf, sizeof(buf), format, v);
    if (!text.empty())
      text += ',';  // appended apart: GCC 12 warns falsely (-Wrestrict) on a + chain
    text += buf;
  }
  return text;
}

std::string joined(const std::vector<std::int64_t>& values) {
  std::string text;
  for (std::int64_t v : values) {
    if (!text.empty()) text += ',';
    text += std::to_string(v);
  }
  return text;
}

// M split in proportion to `weights` by largest remainder; a share may be 0.
std::vector<std::int64_t> largest_remainder(std::int64_t micro_batch,
                                            const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) total += w;
  const auto world = weights.size();
  std::vector<std::int64_t> shares(world);
  std::vector<double> remainder(world);
  std::int64_t given = 0;
  for (std::size_t r = 0; r < world; ++r) {
    // In long double, so that small integer weights (the usual case) split exactly.
    const long double quota =
        static_cast<long double>(micro_batch) * weights[r] / static_cast<long double>(total);
    shares[r] = static_cast<std::int64_t>(std::floor(quota));
    remainder[r] = static_cast<double>(quota - static_cast<long double>(shares[r]));
    given += shares[r];
  }
  std::vector<std::size_t> order(world);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  // The floors leave fewer than W samples over; the rounding of a quota can leave one more or
  // less, which the two loops absorb (each ends within 2W turns).
  for (std::size_t i = 0; given < micro_batch; i = (i + 1) % world, ++given) ++shares[order[i]];
  for (std::size_t r = 0; given > micro_batch; r = (r + 1) % world) {
    if (shares[r] > 0) --shares[r], --given;
  }
  return shares;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The mean of `steps` less those over `outlier_factor` times their median; 0 for none.
double mean_step(const std::vector<double>& steps, double outlier_factor) {
  if (steps.empty()) return 0;
  const double limit = outlier_factor * median(steps);
  double sum = 0;
  std::size_t n = 0;
  for (double s : steps) {
    if (s > limit) continue;
    sum += s;
    ++n;
  }
  return n > 0 ? sum / static_cast<double>(n) : 0;
}

// Steps kept since the last change at most (the mean before a move needs no more); the
// oldest half goes when it is full.
constexpr std::size_t kMaxStepsKept = 4096;

// Throws UsageError unless there are weights and each is a positive finite number; `owner`
// names what weight r belongs to ("rank", "device").
void require_positive(const std::vector<double>& weights, std::int64_t n, const char* owner) {
  PARTRAIN_CHECK(!weights.empty(), UsageError, "no weights to split ", n, " samples by");
  for (std::size_t r = 0; r < weights.size(); ++r) {
    PARTRAIN_CHECK(std::isfinite(weights[r]) && weights[r] > 0, UsageError, owner, " ", r,
                   "'s weight is ", weights[r], "; every weight must be > 0");
  }
}

}  // namespace

std::vector<std::int64_t> weighted_shares(std::int64_t micro_batch,
                                          const std::vector<double>& weights) {
  require_positive(weights, micro_batch, "rank");
  const std::vector<std::int64_t> shares = largest_remainder(micro_batch, weights);
  for (std::size_t r = 0; r < shares.size(); ++r) {
    PARTRAIN_CHECK(shares[r] >= 1, UsageError, "rank ", r, "'s share of ", micro_batch,
                   " samples per micro-step rounds to 0 (weights ", joined(weights, "%g"),
                   "); every rank needs at least 1 sample");
  }
  return shares;
}

std::vector<std::int64_t> proportional_split(std::int64_t n, const std::vector<double>& weights) {
  require_positive(weights, n, "device");
  return largest_remainder(n, weights);
}

std::vector<std::int64_t> speed_shares(std::int64_t micro_batch,
                                       const std::vector<double>& seconds_per_sample) {
  const auto world = static_cast<std::int64_t>(seconds_per_sample.size());
  PARTRAIN_CHECK(world >= 1 && micro_batch >= world, UsageError, micro_batch,
                 " samples per micro-step cannot give each of ", world, " ranks one");
  std::vector<double> speeds;
  for (double s : seconds_per_sample) {
    PARTRAIN_CHECK(std::isfinite(s) && s > 0, UsageError, "a compute time per sample of ", s,
                   " s; every rank needs a positive one");
    speeds.push_back(1.0 / s);
  }
  // A very slow rank may round to 0, which BatchPlan refuses: it takes 1 from the largest.
  std::vector<std::int64_t> shares = largest_remainder(micro_batch, speeds);
  for (auto& b : shares) {
    if (b >= 1) continue;
    b = 1;
    *std::max_element(shares.begin(), shares.end()) -= 1;
  }
  return shares;
}

double predicted_step_seconds(const std::vector<std::int64_t>& shares,
                              const std::vector<double>& seconds_per_sample) {
  PARTRAIN_CHECK_EQ(shares.size(), seconds_per_sample.size(), Error,
                    "one compute time per rank's share");
  double slowest = 0;
  for (std::size_t r = 0; r < shares.size(); ++r) {
    slowest = std::max(slowest, static_cast<double>(shares[r]) * seconds_per_sample[r]);
  }
  return slowest;
}

std::string describe(const BalanceChange& change) {
  std::vector<double> percent;
  for (double a : change.running) percent.push_back(100 * a);
  const std::string figures = "busy s/sample " + joined(change.seconds_per_sample, "%.3g") +
                              "; running " + joined(percent, "%.0f%%");
  char text[160];
  if (change.undo) {
    std::snprintf(text, sizeof(text), "steps took %.3g s after the move, %.3g s before it; ",
                  change.step_seconds, change.before_move_seconds);
    return "step " + std::to_string(change.step) + ": back to shares " + joined(change.shares) +
           " (" + text + figures + ")";
  }
  std::snprintf(text, sizeof(text), "; predicted step %.3g s -> %.3g s", change.predicted_before,
                change.predicted_after);
  std::string tail = text;
  if (change.step_seconds > 0) {
    std::snprintf(text, sizeof(text), "; steps took %.3g s", change.step_seconds);
    tail += text;
  }
  return "step " + std::to_string(change.step) + ": shares " + joined(change.shares) + " (" +
         figures + tail + ")";
}

AutoBalance::AutoBalance(std::vector<std::int64_t> shares, AutoBalanceOptions options)
    : shares_(std::move(shares)),
      options_(options),
      skip_(options.warmup_steps),
      sums_(shares_.size(), 0.0),
      running_sums_(shares_.size(), 0.0) {
  PARTRAIN_CHECK(
      !shares_.empty() && options_.window_steps >= 1 && options_.warmup_steps >= 0 &&
          options_.windows_after_undo >= 0 &&
          options_.max_windows_after_undo >= options_.windows_after_undo &&
          options_.judge_windows >= 1 && options_.judge_seconds >= 0 && options_.judged_gain >= 0 &&
          options_.judged_gain < 1 && options_.outlier_factor >= 1,
      UsageError,
      "auto balance: needs ranks, a window of >= 1 step, warm-up and quiet windows >= 0, a cap "
      "on the quiet windows no smaller than their start, a judged span of >= 1 window and >= 0 "
      "s, a judged gain in [0, 1) and an outlier factor >= 1");
}

bool AutoBalance::spans_enough(const std::vector<double>& steps) const {
  double seconds = 0;
  for (double s : steps) seconds += s;
  return steps.size() >= static_cast<std::size_t>(options_.judge_windows) *
                             static_cast<std::size_t>(options_.window_steps) &&
         seconds >= options_.judge_seconds;
}

std::optional<BalanceChange> AutoBalance::observe(std::int64_t step,
                                                  const std::vector<double>& seconds_per_sample,
                                                  const std::vector<double>& running,
                                                  double step_seconds) {
  PARTRAIN_CHECK_EQ(seconds_per_sample.size(), shares_.size(), Error,
                    "auto balance: one compute time per rank");
  PARTRAIN_CHECK(running.empty() || running.size() == shares_.size(), Error,
                 "auto balance: one running fraction per rank");
  if (shares_.size() < 2) return std::nullopt;
  if (skip_ > 0) {
    --skip_;
    return std::nullopt;
  }
  if (std::isfinite(step_seconds) && step_seconds > 0) {
    std::vector<double>& steps = trial_ ? trial_->steps_after : steps_since_change_;
    // The newest steps count: a long-kept split forgets its oldest half.
    if (steps.size() >= kMaxStepsKept) {
      steps.erase(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(kMaxStepsKept / 2));
    }
    steps.push_back(step_seconds);
  }
  for (std::size_t r = 0; r < sums_.size(); ++r) {
    sums_[r] += seconds_per_sample[r];
    running_sums_[r] += running.empty() ? 1.0 : running[r];
  }
  if (++measured_ < options_.window_steps) return std::nullopt;

  std::vector<double> mean(sums_.size());
  std::vector<double> ran(sums_.size());
  bool measured_all = true;
  for (std::size_t r = 0; r < sums_.size(); ++r) {
    mean[r] = sums_[r] / measured_;
    ran[r] = std::clamp(running_sums_[r] / measured_, 0.0, 1.0);
    measured_all = measured_all && std::isfinite(mean[r]) && mean[r] > 0 && std::isfinite(ran[r]) &&
                   ran[r] > 0;
  }
  std::fill(sums_.begin(), sums_.end(), 0.0);
  std::fill(running_sums_.begin(), running_sums_.end(), 0.0);
  measured_ = 0;
  if (!measured_all) return std::nullopt;
  if (estimates_.empty()) {
    estimates_ = mean;
    running_ = ran;
  } else {
    for (std::size_t r = 0; r < mean.size(); ++r) {
      estimates_[r] += options_.smoothing * (mean[r] - estimates_[r]);
      running_[r] += options_.smoothing * (ran[r] - running_[r]);
    }
  }
  if (trial_) {
    // A move made without step times is kept; one with them waits for its span.
    if (trial_->step_seconds_before > 0) {
      if (!spans_enough(trial_->steps_after)) return std::nullopt;
      const double after = mean_step(trial_->steps_after, options_.outlier_factor);
      if (!(after < (1.0 - options_.judged_gain) * trial_->step_seconds_before)) {
        BalanceChange change{step,
                             trial_->shares_before,
                             estimates_,
                             running_,
                             predicted_step_seconds(shares_, estimates_),
                             predicted_step_seconds(trial_->shares_before, estimates_)};
        change.step_seconds = after;
        change.undo = true;
        change.before_move_seconds = trial_->step_seconds_before;
        if (trial_->first) moved_ = false;
        switch_to(trial_->shares_before);
        trial_.reset();
        steps_since_change_.clear();
        estimates_.clear();
        running_.clear();
        // Doubled for each undo in a row: 2, 4, 8, ... windows, at most the cap (the shift is
        // bounded so that it cannot overflow).
        const int doublings = std::min(undone_in_a_row_, 16);
        quiet_windows_ = static_cast<int>(std::min<std::int64_t>(
            static_cast<std::int64_t>(options_.windows_after_undo) << doublings,
            options_.max_windows_after_undo));
        ++undone_in_a_row_;
        return change;
      }
      undone_in_a_row_ = 0;
      // The kept split's steps so far are the next move's "before".
      steps_since_change_ = std::move(trial_->steps_after);
    }
    trial_.reset();
  }
  if (quiet_windows_ > 0) {
    --quiet_windows_;
    return std::nullopt;
  }
  // With step times, a move waits until the current split's steps span what a move is judged
  // on, so that before and after are measured alike.
  const bool timed = !steps_since_change_.empty();
  if (timed && !spans_enough(steps_since_change_)) return std::nullopt;
  const std::int64_t micro_batch = std::accumulate(shares_.begin(), shares_.end(), 0LL);
  const std::vector<std::int64_t> target = speed_shares(micro_batch, estimates_);
  // The first move goes to the target; later ones half way from the current split to it (both
  // sum to M, so their mean does).
  std::vector<double> halfway(target.size());
  for (std::size_t r = 0; r < target.size(); ++r) {
    halfway[r] = 0.5 * static_cast<double>(shares_[r] + target[r]);
  }
  const std::vector<std::int64_t> proposed =
      moved_ ? weighted_shares(micro_batch, halfway) : target;
  // Whether to move is judged by the target, not by the half-way split: judged by the latter,
  // the moves would stop once half the remaining gain fell under min_gain, short of the target
  // by about twice min_gain.
  const double before = predicted_step_seconds(shares_, estimates_);
  const double best = predicted_step_seconds(target, estimates_);
  const double after = predicted_step_seconds(proposed, estimates_);
  // A first move, all the way, risks twice what a half-way one does on a noisy window: it must
  // promise twice the gain.
  const double min_gain = moved_ ? options_.min_gain : 2 * options_.min_gain;
  if (proposed == shares_ || !(best < (1.0 - min_gain) * before)) return std::nullopt;
  const double steps_before = mean_step(steps_since_change_, options_.outlier_factor);
  trial_ = Trial{shares_, steps_before, !moved_, {}};
  steps_since_change_.clear();
  switch_to(proposed);
  moved_ = true;
  BalanceChange change{step, proposed, estimates_, running_, before, after};
  change.step_seconds = steps_before;
  return change;
}

void AutoBalance::switch_to(const std::vector<std::int64_t>& shares) {
  shares_ = shares;
  skip_ = options_.warmup_steps > 0 ? 1 : 0;
}

}  // namespace partrain::data
