#include "trainer/loop/epoch_loop.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "common/stopwatch.h"
#include "common/worker_lines.h"
#include "trainer/loop/evaluation.h"
#include "trainer/report/metrics_log.h"
#include "trainer/report/progress.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {
namespace {

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

}  // namespace

EpochLoop::EpochLoop(const Config& config, const WorkerEnv& env, EpochLoopParts parts)
    : config_(config), env_(env), parts_(parts) {}

bool EpochLoop::reached_max_steps() const {
  return config_.train.max_steps > 0 && step_ >= config_.train.max_steps;
}

void EpochLoop::run(const TrainingPosition& start) {
  const bool is_rank0 = env_.rank == 0;
  std::unique_ptr<MetricsLog> metrics;
  epochs_ = parts_.checkpointer.previous_epochs();
  if (is_rank0) metrics = std::make_unique<MetricsLog>(config_.output_dir, epochs_);
  Progress progress(is_rank0);
  step_ = start.step;
  parts_.step.precision().restore(start.loss_scaler);
  if (!epochs_.empty()) parts_.step.set_skipped_steps(epochs_.back().skipped_steps);

  for (int epoch = start.epoch + 1; epoch <= config_.train.epochs && !reached_max_steps();
       ++epoch) {
    const auto epoch_start = Clock::now();
    if (!is_rank0) {  // the launcher names the epoch a rank was in from these lines
      std::printf("%s\n", format_epoch_line(epoch, config_.train.epochs).c_str());
      std::fflush(stdout);
    }
    const EpochTotals totals = train_epoch(epoch, metrics.get(), progress);
    const double train_seconds = seconds_since(epoch_start);

    parts_.strategy.share_buffers(parts_.model);
    EvalResult eval = evaluate(parts_.model, parts_.strategy, parts_.test, parts_.device,
                               config_.train.precision);
    std::vector<double> sums{totals.loss_sum, totals.images};
    sum_over_ranks(parts_.strategy.comm(), sums, parts_.device);

    EpochRecord record;
    record.epoch = epoch;
    record.train_seconds = train_seconds;
    record.seconds = seconds_since(epoch_start);
    record.images = static_cast<int64_t>(sums[1]);
    record.train_images_per_s = sums[1] / std::max(1e-9, train_seconds);
    record.steps = step_;
    record.train_loss = sums[0] / std::max(1.0, sums[1]);
    record.test_loss = eval.loss;
    record.test_accuracy = eval.accuracy;
    record.test_accuracy_top5 = eval.accuracy_top5;
    record.skipped_steps = parts_.step.skipped_steps();
    epochs_.push_back(record);
    if (is_rank0) {
      metrics->log_epoch(record);
      progress.finish(
          format_epoch_line(epoch, config_.train.epochs) +
          format(
              " done in %.1f s: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.0f img/s",
              record.seconds, record.train_loss, record.test_loss, 100.0 * record.test_accuracy,
              record.train_images_per_s));
    }
    TrainingPosition position;
    position.epoch = epoch;
    position.step = step_;
    position.loss_scaler = parts_.step.precision().state();
    parts_.checkpointer.maybe_save(position, parts_.model.module(), parts_.optimizer, epochs_,
                                   parts_.strategy.comm());
  }
}

EpochLoop::EpochTotals EpochLoop::train_epoch(int epoch, MetricsLog* metrics, Progress& progress) {
  const bool is_rank0 = env_.rank == 0;
  const int accumulate = config_.train.accumulate_steps;
  data::Loader& loader = parts_.train;
  const int64_t batches = loader.num_batches();
  parts_.model.module().train();
  loader.start_epoch(epoch - 1);
  EpochTotals totals;
  at::Tensor running_loss =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(parts_.device));
  auto window_start = Clock::now();
  int64_t window_images = 0;
  int64_t batch_index = 0;
  while (auto batch = loader.next()) {
    const auto step_start = Clock::now();
    const double wait_before = parts_.strategy.comm_wait_seconds();
    auto images = batch->images.to(parts_.device, true);
    auto labels = batch->labels.to(parts_.device, true);
    const bool sync = (batch_index + 1) % accumulate == 0 || batch_index + 1 == batches;
    // The gradient of a step is the mean over its group of batches; the last group of an
    // epoch may hold fewer than accumulate_steps of them.
    const int64_t group_start = batch_index - batch_index % accumulate;
    const int64_t group_size = std::min<int64_t>(accumulate, batches - group_start);
    at::Tensor loss = parts_.step.run(parts_.model, images, labels, sync, group_size, step_);
    if (sync) ++step_;
    running_loss += loss.to(torch::kFloat64) * static_cast<double>(batch->count);
    totals.images += static_cast<double>(batch->count);
    window_images += batch->count;
    ++batch_index;
    compute_seconds_ +=
        seconds_since(step_start) - (parts_.strategy.comm_wait_seconds() - wait_before);

    const bool log_now = sync && (step_ % config_.train.log_every == 0 || batch_index == batches);
    if (is_rank0 && (log_now || progress.on_terminal())) {
      double rate = window_images * env_.world_size / std::max(1e-9, seconds_since(window_start));
      double current = loss.item<double>();
      progress.update(
          format_epoch_line(epoch, config_.train.epochs) +
              format(" step %lld/%lld loss %.4f %.0f img/s", static_cast<long long>(batch_index),
                     static_cast<long long>(batches), current, rate),
          static_cast<double>(batch_index) / static_cast<double>(batches), log_now);
      if (log_now) {
        metrics->log_step(epoch, step_, current, rate, parts_.step.learning_rate());
        window_start = Clock::now();
        window_images = 0;
      }
    }
    if (reached_max_steps()) break;
  }
  totals.loss_sum = running_loss.item<double>();
  return totals;
}

}  // namespace partrain
