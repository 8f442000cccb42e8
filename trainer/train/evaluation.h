// defines: EvalResult and evaluate() — the test loss and accuracy of the model, each rank
// evaluating its shard of the test set, the sums reduced over the ranks.
#pragma once

#include <c10/core/Device.h>

#include "trainer/data/loader.h"
#include "trainer/train/strategy.h"
#include "trainer/train/train_model.h"

namespace partrain {

struct EvalResult {
  double loss = 0;      // mean cross-entropy over the test set
  double accuracy = 0;  // top-1
};

// Leaves the model in training mode. Every rank must call it (it ends in a collective).
EvalResult evaluate(TrainModel& model, const Strategy& strategy, data::Loader& loader,
                    const c10::Device& device);

}  // namespace partrain
