// defines: TensorBoardLog — rank 0's TensorBoard scalars of a run (observe.tensorboard), one
// event file in the output folder: the tags and when each is written. LibTorch-free.
//
//   train/loss, train/lr           per optimizer step (the loss of its last micro-batch)
//   test/loss, test/accuracy,      per epoch, at the optimizer step the epoch ended on, so
//   test/accuracy_top5,            every chart shares one x axis
//   train/images_per_s,
//   breakdown/<part>               rank 0's share of the epoch's time per breakdown part
//                                  (data_wait, forward, ...; fractions adding up to 1)
#pragma once

#include <cstdint>
#include <string>

#include "trainer/observe/event_file.h"
#include "trainer/report/report_format.h"

namespace partrain {

class TensorBoardLog {
 public:
  explicit TensorBoardLog(const std::string& output_dir) : file_(output_dir) {}

  // wall_time: seconds since the Unix epoch when the step ended.
  void log_step(std::int64_t step, double loss, double lr, double wall_time);
  // rank0: rank 0's breakdown of the epoch, or null when there is none. Writes the file out.
  void log_epoch(const EpochRecord& record, const Breakdown* rank0);
  void flush() { file_.flush(); }
  const std::string& path() const { return file_.path(); }

 private:
  EventFile file_;
};

}  // namespace partrain
