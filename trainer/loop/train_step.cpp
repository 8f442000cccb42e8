#include "trainer/loop/train_step.h"

#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "trainer/device/tensor_memory.h"

namespace partrain {

TrainStepOptions train_step_options(const TrainConfig& train) {
  TrainStepOptions o;
  o.label_smoothing = train.label_smoothing;
  o.clip_grad_norm = train.clip_grad_norm;
  return o;
}

at::Tensor classification_loss(const at::Tensor& logits, const at::Tensor& labels,
                               double label_smoothing) {
  return torch::nn::functional::cross_entropy(
      logits.to(at::kFloat), labels,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
}

TrainStep::TrainStep(TrainStepOptions options, PrecisionPlugin precision, Strategy& strategy,
                     LrSchedule schedule)
    : options_(std::move(options)),
      strategy_(strategy),
      schedule_(schedule),
      precision_(std::move(precision)),
      lr_(schedule.lr_at(0)) {}

at::Tensor TrainStep::run(TrainModel& model, const at::Tensor& images, const at::Tensor& labels,
                          bool sync, std::int64_t group_size, std::int64_t step) {
  Clock::time_point t = times_ ? Clock::now() : Clock::time_point();
  const bool measure = step > 0;
  std::int64_t alive_before = 0;
  if (measure) {
    reset_cpu_tensor_peak();
    alive_before = cpu_tensor_bytes();
  }
  at::Tensor out;
  {
    const AutocastScope autocast = precision_.forward_context();
    out = strategy_.forward(model, images);
  }
  at::Tensor loss = classification_loss(out, labels, options_.label_smoothing);
  if (sample_delay_s_ > 0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>(sample_delay_s_ * static_cast<double>(images.size(0))));
  }
  t = mark(Phase::kForward, t);
  strategy_.prepare_for_backward(sync);
  precision_.scale_loss(group_size > 1 ? loss / static_cast<double>(group_size) : loss).backward();
  t = mark(Phase::kBackward, t);
  if (measure)
    step_peak_bytes_ = std::max(step_peak_bytes_, cpu_tensor_peak_bytes() - alive_before);
  if (sync) update(step, t);
  return loss.detach();
}

// The comm_exposed phase is the wait for the averaged gradients; the update (unscale and
// check, clip, step, zero) is the optimizer phase.
void TrainStep::update(std::int64_t step, Clock::time_point since) {
  strategy_.finish_backward();
  since = mark(Phase::kCommExposed, since);
  lr_ = schedule_.lr_at(step);
  if (!strategy_.step(UpdateOptions{lr_, options_.clip_grad_norm}, precision_)) ++skipped_;
  mark(Phase::kOptimizer, since);
}

}  // namespace partrain
