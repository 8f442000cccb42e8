#include "trainer/loop/balance_control.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "trainer/data/loader.h"
#include "trainer/observe/phase_times.h"
#include "trainer/observe/stall_meter.h"
#include "trainer/parallel/strategy.h"

namespace partrain {

BalanceControl::BalanceControl(const Config& config, const WorkerEnv& env, data::Loader& train,
                               Strategy& strategy, PhaseTimes& times)
    : config_(config), env_(env), train_(train), strategy_(strategy), times_(times) {}

BalanceControl::~BalanceControl() = default;

void BalanceControl::start(const std::vector<std::int64_t>& resumed) {
  if (config_.data.global_batch_size <= 0) return;
  shares_ = config_.data.shares;
  if (!resumed.empty() && resumed != shares_) use_shares(resumed);
  if (config_.data.balance == BalanceMode::kAuto && env_.world_size > 1) {
    auto_balance_.emplace(shares_);
    stalls_ = std::make_unique<StallMeter>();
    times_.keep_work_spans();
  }
}

void BalanceControl::use_shares(const std::vector<std::int64_t>& shares) {
  shares_ = shares;
  train_.set_shares(shares_);
  strategy_.set_rank_share(shares_.at(static_cast<std::size_t>(env_.rank)),
                           micro_batch_size(config_));
}

void BalanceControl::start_measuring() {
  times_.take_work_spans();
  measured_from_ = Clock::now();
  step_samples_ = 0;
}

void BalanceControl::fill_slots(StepSlots& slots) {
  if (!auto_balance_) return;
  const RankSpeed speed = measure_speed();
  slots.seconds_per_sample(env_.rank) = speed.seconds_per_sample;
  slots.running(env_.rank) = speed.running;
  if (env_.rank == 0) slots.step_seconds() = speed.step_seconds;
}

void BalanceControl::after_exchange(std::int64_t step, StepSlots& slots) {
  if (!auto_balance_) return;
  const std::optional<data::BalanceChange> change = auto_balance_->observe(
      step, slots.seconds_per_sample(), slots.running(), slots.step_seconds());
  if (!change) return;
  use_shares(change->shares);
  changes_.push_back(*change);
  if (env_.rank == 0) {
    std::printf("balance auto: %s\n", data::describe(*change).c_str());
    std::fflush(stdout);
  }
}

BalanceControl::RankSpeed BalanceControl::measure_speed() {
  using Seconds = std::chrono::duration<double>;
  const std::vector<TimeSpan> work = times_.take_work_spans();
  const Clock::time_point now = Clock::now();
  Clock::duration busy{0};
  for (const TimeSpan& span : work) busy += span.end - span.start;
  // Its own work net of stalls, then the stalls: one no longer than that work is a slice of
  // it, as a device shared in slices makes (the work takes longer however the stalls land,
  // in the work or in a wait at a collective, where it holds every other rank up too), and
  // counts with the work. One longer than the work is an absence for whole steps, which no
  // share of the samples shortens (the others wait at the allreduce for it whatever its
  // share): it stays out of the speed, or moving samples off the rank would only make its
  // absences weigh more per sample and move more.
  const TimeSpan measured{measured_from_, now};
  const Clock::duration held = stalls_->stalled_within({measured});
  const Clock::duration net_work =
      std::max(busy - stalls_->stalled_within(work), Clock::duration{0});
  const Clock::duration slices =
      stalls_within_work(stalls_->stalls_overlapping(measured), measured, net_work);
  RankSpeed speed;
  if (step_samples_ > 0) {
    speed.seconds_per_sample =
        Seconds(net_work + slices).count() / static_cast<double>(step_samples_);
  }
  const Clock::duration elapsed = now - measured_from_;
  speed.step_seconds = Seconds(elapsed).count();
  if (elapsed > Clock::duration{0}) {
    speed.running = std::clamp(1.0 - Seconds(held).count() / Seconds(elapsed).count(), 0.0, 1.0);
  }
  measured_from_ = now;
  step_samples_ = 0;
  return speed;
}

std::optional<BalanceRecord> BalanceControl::record() const {
  if (shares_.empty()) return std::nullopt;
  BalanceRecord record;
  record.mode = name_of(config_.data.balance);
  record.shares = shares_;
  for (const data::BalanceChange& c : changes_) {
    record.changes.push_back({c.step, c.shares, c.seconds_per_sample, c.running, c.predicted_before,
                              c.predicted_after, c.step_seconds, c.undo, c.before_move_seconds});
  }
  return record;
}

}  // namespace partrain
