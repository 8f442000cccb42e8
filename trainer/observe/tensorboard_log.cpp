#include "trainer/observe/tensorboard_log.h"

#include <vector>

namespace partrain {

void TensorBoardLog::log_step(std::int64_t step, double loss, double lr, double wall_time) {
  file_.add(step, {{"train/loss", loss}, {"train/lr", lr}}, wall_time);
}

void TensorBoardLog::log_epoch(const EpochRecord& record, const Breakdown* rank0) {
  std::vector<TaggedScalar> values{{"test/loss", record.test_loss},
                                   {"test/accuracy", record.test_accuracy},
                                   {"test/accuracy_top5", record.test_accuracy_top5},
                                   {"train/images_per_s", record.train_images_per_s}};
  if (rank0 != nullptr && rank0->total() > 0) {
    const double total = rank0->total();
    for (const auto& [name, part] : kBreakdownParts) {
      values.push_back({"breakdown/" + std::string(name), (*rank0).*part / total});
    }
  }
  file_.add(record.steps, values);
  file_.flush();
}

}  // namespace partrain
