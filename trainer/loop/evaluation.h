// defines: EvalResult, evaluate() and top_k_correct() — the test loss and top-1 / top-5
// accuracy of the model, each rank evaluating its shard of the test set, the sums reduced
// over the ranks.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

#include "trainer/config/config_enums.h"
#include "trainer/data/loader.h"
#include "trainer/parallel/strategy.h"
#include "trainer/model/train_model.h"

namespace partrain {

struct EvalResult {
  double loss = 0;           // mean cross-entropy over the test set
  double accuracy = 0;       // top-1
  double accuracy_top5 = 0;  // the label among the 5 largest logits (all of them if fewer classes)
};

// Leaves the model in training mode. Every rank must call it (it ends in a collective).
// precision: as train.precision, the forward under autocast for bf16 and f16.
EvalResult evaluate(TrainModel& model, const Strategy& strategy, data::Loader& loader,
                    const c10::Device& device, Precision precision = Precision::kF32);

// How many rows of `logits` [N, K] have their label [N] among their k largest entries
// (k is cut to K). Ties at the k-th place are broken as topk breaks them.
std::int64_t top_k_correct(const at::Tensor& logits, const at::Tensor& labels, std::int64_t k);

}  // namespace partrain
