#include "trainer/loop/train_step.h"

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <thread>

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
                     torch::optim::Optimizer& optimizer, LrSchedule schedule)
    : options_(std::move(options)),
      strategy_(strategy),
      optimizer_(optimizer),
      schedule_(schedule),
      precision_(std::move(precision)),
      lr_(schedule.lr_at(0)) {}

at::Tensor TrainStep::run(TrainModel& model, const at::Tensor& images, const at::Tensor& labels,
                          bool sync, std::int64_t group_size, std::int64_t step) {
  Clock::time_point t = times_ ? Clock::now() : Clock::time_point();
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
  if (sync) update(model, step, t);
  return loss.detach();
}

// Order matters: clipping and the finiteness check see the gradients averaged over the ranks
// (identical everywhere), so every rank clips by the same factor and skips the same steps.
void TrainStep::update(TrainModel& model, std::int64_t step, Clock::time_point since) {
  strategy_.finish_backward();
  since = mark(Phase::kCommExposed, since);
  const std::vector<at::Tensor> parameters = model.module().parameters();
  const bool finite = precision_.unscale_and_check(parameters, strategy_.comm());
  if (finite && options_.clip_grad_norm > 0) {
    torch::nn::utils::clip_grad_norm_(parameters, options_.clip_grad_norm);
  }
  lr_ = schedule_.lr_at(step);
  for (auto& group : optimizer_.param_groups()) group.options().set_lr(lr_);
  if (finite) {
    optimizer_.step();
  } else {
    ++skipped_;
  }
  precision_.update(finite);
  optimizer_.zero_grad();
  mark(Phase::kOptimizer, since);
}

}  // namespace partrain
