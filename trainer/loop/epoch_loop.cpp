#include "trainer/loop/epoch_loop.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "common/stop_request.h"
#include "common/stopwatch.h"
#include "common/worker_lines.h"
#include "trainer/loop/evaluation.h"
#include "trainer/loop/step_exchange.h"
#include "trainer/observe/flight_recorder.h"
#include "trainer/observe/tensorboard_log.h"
#include "trainer/parallel/tensor_buffer.h"
#include "trainer/report/metrics_log.h"
#include "trainer/report/progress.h"

namespace partrain {
namespace {

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

EpochLoop::EpochLoop(const Config& config, const WorkerEnv& env, EpochLoopParts parts)
    : config_(config),
      env_(env),
      parts_(parts),
      balance_(config, env, parts.train, parts.strategy, parts.observer.times()) {
  parts_.step.time_phases(parts_.observer.times());
  parts_.step.slow_forward(parts_.observer.sample_delay());
}

bool EpochLoop::reached_max_steps() const {
  return config_.train.max_steps > 0 && step_ >= config_.train.max_steps;
}

// A mid-epoch checkpoint: its epoch goes on from the next batch, with this rank's sums of the
// batches before (rank 0 holds all of them when the checkpoint has another rank count).
EpochLoop::EpochTotals EpochLoop::resumed_totals(const MidEpoch& mid) const {
  EpochTotals resumed;
  if (!mid.any()) return resumed;
  const auto r = static_cast<std::size_t>(env_.rank);
  if (mid.loss_sums.size() == static_cast<std::size_t>(env_.world_size) &&
      mid.images.size() == mid.loss_sums.size()) {
    resumed.loss_sum = mid.loss_sums[r];
    resumed.images = mid.images[r];
  } else if (env_.rank == 0) {
    for (double v : mid.loss_sums) resumed.loss_sum += v;
    for (double v : mid.images) resumed.images += v;
  }
  resumed.seconds = mid.train_seconds;
  return resumed;
}

void EpochLoop::run(const TrainingPosition& start) {
  const bool is_rank0 = env_.rank == 0;
  std::unique_ptr<MetricsLog> metrics;
  epochs_ = parts_.checkpointer.previous_epochs();
  if (is_rank0) metrics = std::make_unique<MetricsLog>(config_.output_dir, epochs_, start.step);
  // A resumed run starts a file of its own; TensorBoard reads every file of the folder.
  std::unique_ptr<TensorBoardLog> tensorboard;
  if (is_rank0 && config_.observe.tensorboard) {
    tensorboard = std::make_unique<TensorBoardLog>(config_.output_dir);
  }
  Progress progress(is_rank0);
  step_ = start.step;
  parts_.step.precision().restore(start.loss_scaler);
  if (!epochs_.empty()) parts_.step.set_skipped_steps(epochs_.back().skipped_steps);
  RunObserver& observer = parts_.observer;
  PhaseTimes& times = observer.times();
  observer.start();

  const MidEpoch& mid = start.mid_epoch;
  if (mid.any()) parts_.step.set_skipped_steps(mid.skipped_steps);
  balance_.start(start.shares);
  const EpochTotals resumed = resumed_totals(mid);

  for (int epoch = start.epoch + 1;
       epoch <= config_.train.epochs &&
       (!reached_max_steps() || (mid.any() && epoch == start.epoch + 1));
       ++epoch) {
    const auto epoch_start = Clock::now();
    if (!is_rank0) {  // the launcher names the epoch a rank was in from these lines
      std::printf("%s\n", format_epoch_line(epoch, config_.train.epochs).c_str());
      std::fflush(stdout);
    }
    const bool resuming = mid.any() && epoch == start.epoch + 1;
    const EpochTotals totals =
        train_epoch(epoch, resuming ? mid.micro_step : 0, resuming ? resumed : EpochTotals{},
                    metrics.get(), tensorboard.get(), progress);
    if (stopped_) return;  // saved at the step it stopped; the epoch goes on when resumed
    const double train_seconds = seconds_since(epoch_start) + totals.seconds;

    times.set_step(step_);
    Clock::time_point mark = Clock::now();
    parts_.strategy.share_buffers(parts_.model);
    EvalResult eval = evaluate(parts_.model, parts_.strategy, parts_.test, parts_.device,
                               config_.train.precision);
    std::vector<double> sums{totals.loss_sum, totals.images};
    sum_over_ranks(parts_.strategy.comm(), sums, parts_.device);
    mark = times.mark(Phase::kEvaluation, mark);

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
    TrainingPosition position;
    position.epoch = epoch;
    position.step = step_;
    position.loss_scaler = parts_.step.precision().state();
    position.shares = balance_.shares();
    mark = Clock::now();
    parts_.checkpointer.maybe_save(position, parts_.model, parts_.strategy, epochs_);
    times.mark(Phase::kCheckpoint, mark);
    // Logged after the checkpoint, so that the epoch's breakdown includes it.
    const std::vector<Breakdown> breakdown =
        observer.end_epoch(parts_.strategy.comm(), parts_.device);
    if (is_rank0) {
      metrics->log_epoch(record, breakdown);
      if (tensorboard) tensorboard->log_epoch(record, breakdown.empty() ? nullptr : &breakdown[0]);
      progress.finish(
          format_epoch_line(epoch, config_.train.epochs) +
          format(
              " done in %.1f s: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.0f img/s",
              record.seconds, record.train_loss, record.test_loss, 100.0 * record.test_accuracy,
              record.train_images_per_s));
      if (observer.straggler_news()) progress.finish(*observer.straggler_news());
    }
  }
  observer.finish();
}

EpochLoop::EpochTotals EpochLoop::train_epoch(int epoch, std::int64_t first_batch,
                                              const EpochTotals& before, MetricsLog* metrics,
                                              TensorBoardLog* tensorboard, Progress& progress) {
  const bool is_rank0 = env_.rank == 0;
  const int accumulate = config_.train.accumulate_steps;
  data::Loader& loader = parts_.train;
  const int64_t batches = loader.num_batches();
  parts_.model.module().train();
  loader.start_epoch(epoch - 1, first_batch);
  const auto epoch_start = Clock::now();
  EpochTotals totals;
  totals.images = before.images;
  totals.seconds = before.seconds;
  at::Tensor running_loss = torch::full(
      {}, before.loss_sum, torch::TensorOptions().dtype(torch::kFloat64).device(parts_.device));
  auto window_start = Clock::now();
  int64_t window_images = 0;
  int64_t batch_index = first_batch;
  RunObserver& observer = parts_.observer;
  PhaseTimes& times = observer.times();
  times.set_step(step_);
  flight_recorder().set_step(step_);
  balance_.start_measuring();
  // Images of all ranks per micro-step, for the rate on the progress line.
  const bool per_rank = balance_.shares().empty();
  const std::int64_t images_per_batch_all = per_rank ? 0 : micro_batch_size(config_);
  Clock::time_point mark = Clock::now();  // the wait for the next batch starts here
  while (!reached_max_steps()) {
    auto batch = loader.next();
    if (!batch) break;
    const auto step_start = Clock::now();
    const double wait_before = parts_.strategy.comm_wait_seconds();
    observer.inject_step_delay();
    auto images = batch->images.to(parts_.device, true);
    auto labels = batch->labels.to(parts_.device, true);
    times.mark(Phase::kDataWait, mark);
    const bool sync = (batch_index + 1) % accumulate == 0 || batch_index + 1 == batches;
    // The gradient of a step is the mean over its group of batches; the last group of an
    // epoch may hold fewer than accumulate_steps of them.
    const int64_t group_start = batch_index - batch_index % accumulate;
    const int64_t group_size = std::min<int64_t>(accumulate, batches - group_start);
    at::Tensor loss = parts_.step.run(parts_.model, images, labels, sync, group_size, step_);
    observer.after_batch(sync, step_, parts_.strategy.bucket_timings());
    if (sync) ++step_;
    if (sync && tensorboard) {
      held_steps_.push_back(
          {step_, loss.detach(), parts_.step.learning_rate(), unix_seconds_now()});
    }
    running_loss += loss.to(torch::kFloat64) * static_cast<double>(batch->count);
    totals.images += static_cast<double>(batch->count);
    balance_.count_samples(batch->count);
    window_images += per_rank ? batch->count * env_.world_size : images_per_batch_all;
    ++batch_index;
    compute_seconds_ +=
        seconds_since(step_start) - (parts_.strategy.comm_wait_seconds() - wait_before);

    const bool log_now = sync && (step_ % config_.train.log_every == 0 || batch_index == batches);
    if (is_rank0 && (log_now || progress.on_terminal())) {
      double rate = window_images / std::max(1e-9, seconds_since(window_start));
      double current = loss.item<double>();
      progress.update(
          format_epoch_line(epoch, config_.train.epochs) +
              format(" step %lld/%lld loss %.4f %.0f img/s", static_cast<long long>(batch_index),
                     static_cast<long long>(batches), current, rate),
          static_cast<double>(batch_index) / static_cast<double>(batches), log_now);
      if (log_now) {
        metrics->log_step(epoch, step_, current, rate, parts_.step.learning_rate());
        if (tensorboard) write_held_steps(*tensorboard);
        window_start = Clock::now();
        window_images = 0;
      }
    }
    if (sync) {
      EpochTotals so_far = totals;
      so_far.seconds = before.seconds + seconds_since(epoch_start);
      if (after_step(epoch, batch_index, running_loss, so_far)) break;
    }
    times.set_step(step_);
    flight_recorder().set_step(step_);
    mark = Clock::now();
  }
  if (tensorboard) write_held_steps(*tensorboard);
  totals.loss_sum = running_loss.item<double>();
  return totals;
}

void EpochLoop::write_held_steps(TensorBoardLog& tensorboard) {
  if (held_steps_.empty()) return;
  std::vector<at::Tensor> losses;
  losses.reserve(held_steps_.size());
  for (const HeldStep& s : held_steps_) losses.push_back(s.loss.reshape({}));
  const at::Tensor values = torch::stack(losses).to(torch::kCPU, torch::kFloat64);
  const double* v = values.data_ptr<double>();
  for (std::size_t i = 0; i < held_steps_.size(); ++i) {
    tensorboard.log_step(held_steps_[i].step, v[i], held_steps_[i].lr, held_steps_[i].wall_time);
  }
  held_steps_.clear();
}

bool EpochLoop::after_step(int epoch, std::int64_t batches_done, const at::Tensor& running_loss,
                           EpochTotals so_far) {
  StepSlots slots(env_.world_size);
  slots.stop_requests() = StopRequest::requested() ? 1.0 : 0.0;
  if (env_.rank == 0) slots.checkpoint_due() = parts_.checkpointer.timed_checkpoint_due() ? 1 : 0;
  balance_.fill_slots(slots);
  exchange_step(slots, parts_.strategy.comm(), parts_.device);
  agreed_on_a_step_ = true;
  // Before a checkpoint of this step, so that it records the split the next steps take.
  balance_.after_exchange(step_, slots);
  const bool stop = slots.stop_requests() > 0;
  const bool save =
      stop || slots.checkpoint_due() > 0 || parts_.checkpointer.step_checkpoint_due(step_);
  if (!save) return false;
  so_far.loss_sum = running_loss.item<double>();
  // A second signal while the stop's checkpoint is written ends the process at once; the
  // previous checkpoint stays whole (atomic writes).
  if (stop) StopRequest::set_saving(true);
  const std::string name = save_mid_epoch(epoch, batches_done, so_far);
  // The write is nobody's step: the next step's time starts after it.
  balance_.start_measuring();
  if (!stop) return false;
  StopRequest::set_saving(false);
  stopped_ = Stopped{step_, name, static_cast<int>(slots.stop_requests())};
  return true;
}

std::string EpochLoop::save_mid_epoch(int epoch, std::int64_t batches_done,
                                      const EpochTotals& so_far) {
  // Every rank's sums of the partial epoch, for rank 0 to write: rank r fills slots r and
  // W + r, the sum over ranks fills them all.
  const auto world = static_cast<std::size_t>(env_.world_size);
  const auto r = static_cast<std::size_t>(env_.rank);
  std::vector<double> sums(2 * world, 0.0);
  sums[r] = so_far.loss_sum;
  sums[world + r] = so_far.images;
  sum_over_ranks(parts_.strategy.comm(), sums, parts_.device);

  TrainingPosition position;
  position.epoch = epoch - 1;
  position.step = step_;
  position.loss_scaler = parts_.step.precision().state();
  position.mid_epoch.micro_step = batches_done;
  position.mid_epoch.loss_sums.assign(sums.begin(), sums.begin() + static_cast<long>(world));
  position.mid_epoch.images.assign(sums.begin() + static_cast<long>(world), sums.end());
  position.mid_epoch.train_seconds = so_far.seconds;
  position.mid_epoch.skipped_steps = parts_.step.skipped_steps();
  position.shares = balance_.shares();
  return parts_.checkpointer.save_step(position, parts_.model, parts_.strategy, epochs_);
}

}  // namespace partrain
