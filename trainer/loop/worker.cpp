// One rank's run, as a sequence of named parts (the file of each in brackets). For strategy
// ddp (single and dp are the same without the communicator, dp with the batch split over the
// visible GPUs inside the step):
//
//   pick the device, set it before any other device work       [rank_device]
//   -> rendezvous: store and communicator                       [rendezvous]
//   -> load this rank's data and loaders                        [rank_data]
//   -> build the model, the same on every rank                  [strategy, train_model]
//   -> optimizer, learning-rate schedule, precision             [optimizer, lr_schedule,
//                                                                precision]
//   -> resume from a checkpoint, if any                         [checkpoint]
//   -> for each epoch: train steps (the Reducer overlaps the    [epoch_loop, train_step,
//      gradient allreduce with backward), evaluate on this       evaluation]
//      rank's shard of the test set, log, checkpoint
//   -> gather per-rank figures, report                          [final_report]
#include "trainer/loop/worker.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdio>

#include "common/stopwatch.h"
#include "trainer/precision/precision.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/epoch_loop.h"
#include "trainer/loop/final_report.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/optim/optimizer.h"
#include "trainer/loop/rank_data.h"
#include "trainer/device/rank_device.h"
#include "trainer/parallel/rendezvous.h"
#include "trainer/parallel/strategy.h"
#include "trainer/loop/train_step.h"

namespace partrain {

int run_worker(const Config& cfg, const WorkerEnv& env) {
  const auto run_start = Clock::now();
  set_intra_op_threads(cfg, env);
  const c10::Device device = pick_device(cfg, env);
  PrecisionPlugin precision = PrecisionPlugin::for_training(cfg.train.precision, device);
  const std::string note = precision_note(cfg.train.precision, device);
  if (!note.empty() && env.rank == 0) std::printf("%s\n", note.c_str());
  RankGroup group = join_rank_group(cfg, env, device);
  RankData data = load_rank_data(cfg, env, group.store(), group.timeout);

  Strategy strategy(cfg, device, group.comm.get());
  const ModelShape shape{data.train_set->channels, data.train_set->height,
                         data.train_set->num_classes, data.train_set->width};
  std::unique_ptr<TrainModel> model = strategy.build_model(shape, group.batchnorm_comm.get());
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      make_optimizer(cfg.train.optimizer, model->module().parameters());

  Checkpointer checkpointer(cfg, env);
  const TrainingPosition position =
      checkpointer.resume(model->module(), *optimizer, strategy.comm());
  if (position.epoch > 0 && env.rank == 0) {
    std::printf("resumed from %s: epoch %d done, %lld steps\n", position.source.c_str(),
                position.epoch, static_cast<long long>(position.step));
  }
  strategy.start_gradient_averaging(*model);
  if (CheckpointState* state = strategy.checkpoint_state()) checkpointer.attach(*state);

  TrainStep step(train_step_options(cfg.train), std::move(precision), strategy, *optimizer,
                 LrSchedule(cfg.train.schedule, cfg.train.optimizer.lr,
                            total_optimizer_steps(cfg.train, data.train->num_batches())));
  EpochLoop loop(cfg, env,
                 EpochLoopParts{*model, strategy, step, *optimizer, *data.train, *data.test,
                                checkpointer, device});
  loop.run(position);

  gather_and_write_report(cfg, env, device, strategy, loop.compute_seconds(), loop.epochs(),
                          run_start);
  if (group.comm) group.comm->barrier();
  return 0;
}

}  // namespace partrain
