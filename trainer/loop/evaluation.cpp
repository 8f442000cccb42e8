#include "trainer/loop/evaluation.h"

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <vector>

#include "trainer/precision/precision.h"
#include "trainer/parallel/tensor_buffer.h"

namespace partrain {

std::int64_t top_k_correct(const at::Tensor& logits, const at::Tensor& labels, std::int64_t k) {
  const std::int64_t kept = std::min<std::int64_t>(k, logits.size(1));
  const at::Tensor top = std::get<1>(logits.topk(kept, /*dim=*/1));
  return top.eq(labels.unsqueeze(1)).any(1).sum().item<std::int64_t>();
}

// Each rank evaluates positions r, r+W, ... of the unshuffled test set; the sampler pads the
// last round with repeats, which are cut off here so every test sample counts exactly once.
EvalResult evaluate(TrainModel& model, const Strategy& strategy, data::Loader& loader,
                    const c10::Device& device, Precision precision) {
  torch::NoGradGuard no_grad;
  model.module().eval();
  const auto& sampler = loader.sampler();
  const int64_t W = sampler.options().world_size, r = sampler.options().rank;
  const int64_t n = sampler.dataset_size();
  int64_t remaining = (n - r + W - 1) / W;  // real (unpadded) samples of this rank
  double loss_sum = 0, correct = 0, correct5 = 0, count = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    int64_t valid = std::min<int64_t>(remaining, batch->count);
    remaining -= valid;
    if (valid <= 0) continue;
    auto images = batch->images.narrow(0, 0, valid).to(device, /*non_blocking=*/true);
    auto labels = batch->labels.narrow(0, 0, valid).to(device, true);
    at::Tensor out;
    {
      const AutocastScope autocast(precision, device);
      out = strategy.forward(model, images);
    }
    out = out.to(at::kFloat);
    loss_sum +=
        torch::nn::functional::cross_entropy(
            out, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += out.argmax(1).eq(labels).sum().item<double>();
    correct5 += static_cast<double>(top_k_correct(out, labels, 5));
    count += static_cast<double>(valid);
  }
  std::vector<double> sums{loss_sum, correct, correct5, count};
  sum_over_ranks(strategy.comm(), sums, device);
  model.module().train();
  const double n_all = std::max(1.0, sums[3]);
  return {sums[0] / n_all, sums[1] / n_all, sums[2] / n_all};
}

}  // namespace partrain
