#include "trainer/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace partrain {

LrSchedule::LrSchedule(const ScheduleConfig& config, double base_lr, std::int64_t total_steps)
    : config_(config), base_lr_(base_lr), total_steps_(total_steps) {}

double LrSchedule::lr_at(std::int64_t step) const {
  const std::int64_t warmup = config_.warmup_steps;
  if (step < warmup) {
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup);
  }
  const std::int64_t after = step - warmup;
  switch (config_.name) {
    case ScheduleName::kStep:
      return base_lr_ * std::pow(config_.gamma, static_cast<double>(after / config_.step_size));
    case ScheduleName::kCosine: {
      const std::int64_t span = std::max<std::int64_t>(1, total_steps_ - warmup);
      const double p = std::min(1.0, static_cast<double>(after + 1) / static_cast<double>(span));
      return config_.min_lr + (base_lr_ - config_.min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
    }
    case ScheduleName::kConstant:
      break;
  }
  return base_lr_;
}

std::int64_t total_optimizer_steps(const TrainConfig& train, std::int64_t batches_per_epoch) {
  const std::int64_t per_epoch =
      (batches_per_epoch + train.accumulate_steps - 1) / train.accumulate_steps;
  const std::int64_t total = per_epoch * train.epochs;
  return train.max_steps > 0 ? std::min(total, train.max_steps) : total;
}

}  // namespace partrain
