// One rank's run, as a sequence of named parts (the file of each in brackets). For strategy
// ddp (single and dp are the same without the communicator, dp with the batch split over the
// visible GPUs inside the step):
//
//   meet the other ranks: the store, every config against      [rendezvous,
//      rank 0's                                                  config_agreement]
//   -> pick the device, set it before any other device work     [rank_device]
//   -> the communicators                                         [rendezvous]
//   -> each rank's clock offset to rank 0, through the store     [observer]
//   -> load this rank's data and loaders                        [rank_data]
//   -> the strategy: single, dp, ddp or sharded ddp             [strategy]
//   -> build the model, the same on every rank                  [strategy, train_model]
//   -> the strategy's optimizer, learning-rate schedule,        [strategy, optimizer,
//      precision                                                 lr_schedule, precision]
//   -> resume from a checkpoint, if any                         [checkpoint]
//   -> for each epoch: train steps (the Reducer overlaps the    [epoch_loop, train_step,
//      gradient allreduce with backward), evaluate on this       evaluation, step_exchange]
//      rank's shard of the test set, log, checkpoint; after
//      each step the ranks agree whether to stop (a signal)
//      or to take a mid-epoch checkpoint
//   -> the trace to rank 0 (observe.trace)                      [observer]
//   -> gather per-rank figures, report                          [final_report]
//      or, stopped at a signal: say where, exit kExitStopped
#include "trainer/loop/worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "common/errors.h"
#include "common/stop_request.h"
#include "common/stopwatch.h"
#include "common/worker_lines.h"
#include "trainer/device/rank_device.h"
#include "trainer/device/tensor_memory.h"
#include "trainer/loop/checkpoint.h"
#include "trainer/loop/epoch_loop.h"
#include "trainer/loop/final_report.h"
#include "trainer/loop/observer.h"
#include "trainer/loop/rank_data.h"
#include "trainer/loop/train_step.h"
#include "trainer/observe/test_injection.h"
#include "trainer/observe/flight_recorder.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/parallel/rendezvous.h"
#include "trainer/parallel/strategy.h"
#include "trainer/precision/precision.h"
#include "trainer/report/process_memory.h"

namespace partrain {

namespace {

// Every rank's last line on stderr after a stop (the launcher reads the step from it); rank 0's
// also names the checkpoint and what to do next, for a run without partrain's launcher.
void say_stopped(const EpochLoop::Stopped& stopped, const Checkpointer& checkpointer, int rank) {
  const int own = StopRequest::signal();
  const std::string by = own != 0 ? StopRequest::signal_name(own)
                                  : "a stop request of " + std::to_string(stopped.stop_requests) +
                                        " other rank" + (stopped.stop_requests > 1 ? "s" : "");
  std::string line = format_stopped_line(stopped.step, by);
  if (rank == 0) {
    line += "; saved " + checkpointer.directory() + "/" + stopped.checkpoint +
            "; run the same command to continue";
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

// Where `error` lost a rank that stopped in its start-up and said so (StopRequest), how that
// stop reached this rank: "SIGTERM to rank 0"; empty otherwise.
std::string start_up_stop_of_lost_rank(const CommError& error) {
  const auto* peer = dynamic_cast<const PeerError*>(&error);
  if (peer == nullptr) return "";
  const auto stopped = parse_rank_stopped(error.what(), peer->peer_rank());
  const std::size_t at = stopped ? stopped->why.find(kStartUpStopWhy) : std::string::npos;
  if (at == std::string::npos) return "";
  return stopped->why.substr(0, at) + " to rank " + std::to_string(peer->peer_rank());
}

// A stop before the ranks agreed on any step, as this rank meets it after its own start-up
// (a peer's ended first, or its steps had begun when the signal came): nothing to save, not
// a failure. This rank's own stop signal, or the one a lost rank said it stopped at. The
// line is the one a stop in the start-up writes (StopRequest); false where neither applies.
// On its own signal the rank first tells the others why, as a stop in the start-up does: one
// still on its way to the first step finds this rank gone later and takes it as the same stop.
bool stopped_before_any_step(const CommError& error, comm::RankGroup* ranks) {
  const int own = StopRequest::signal();
  const std::string by =
      own != 0 ? std::string(StopRequest::signal_name(own)) : start_up_stop_of_lost_rank(error);
  if (by.empty()) return false;
  if (own != 0 && ranks != nullptr) ranks->tell_stopped(by + std::string(kStartUpStopWhy));
  std::fprintf(stderr, "%s\n", format_start_up_stop_line(by).c_str());
  std::fflush(stderr);
  return true;
}

// Test-only (PARTRAIN_TEST_START_DELAY, test_injection.h): this rank holds at the end of its
// start-up, its peers already at their first step, so that a test can stop the run there.
void hold_start_up_for_test(int rank) {
  const double seconds = injected_faults(rank).start_delay_s;
  if (seconds <= 0) return;
  std::fprintf(stderr, "partrain: rank %d holds its start-up for %g s (test)\n", rank, seconds);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// A collective failed or timed out: this rank's last collectives go to
// OUTPUT/flight/rank-R.json, and one line tells the launcher where it stood.
void dump_flight_record(const Config& cfg, const WorkerEnv& env, const char* error) {
  const std::vector<FlightEntry> entries = flight_recorder().entries();
  if (entries.empty()) return;  // no collective ran: nothing to say where it stood
  const std::string path = dump_flight(cfg.output_dir, env.rank, env.world_size, error, entries);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::fprintf(
      stderr, "%s\n",
      format_flight_line(describe_flight(entries, now), path.empty() ? "not written" : path)
          .c_str());
  std::fflush(stderr);
}

// The run from the ranks' meeting on; `group` is filled here and outlives this (run_worker()).
int run_met_ranks(Config& config, const WorkerEnv& env, comm::RankGroup* ranks, RankGroup& group,
                  Clock::time_point run_start, RankMemory memory) {
  // Global-batch mode: each rank's share of the batch, known now that the world size is.
  resolve_batch_size(config, env.world_size, env.rank);
  const Config& cfg = config;
  // Flight records of an earlier failure in this folder would read as this run's. No rank dumps
  // before its communicator is made, which needs rank 0 past this point.
  if (env.rank == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(cfg.output_dir + "/flight", ignored);
  }
  set_intra_op_threads(cfg, env);
  const c10::Device device = pick_device(cfg, env);
  PrecisionPlugin precision = PrecisionPlugin::for_training(cfg.train.precision, device);
  const std::string note = precision_note(cfg.train.precision, device);
  if (!note.empty() && env.rank == 0) std::printf("%s\n", note.c_str());
  // Each phase of the start-up, timed for the report (explain's start-up part).
  auto phase_start = Clock::now();
  auto phase_seconds = [&phase_start] {
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - phase_start).count();
    phase_start = now;
    return seconds;
  };
  group = join_rank_group(cfg, device, ranks);
  RunObserver observer(cfg, env);
  observer.startup().join = std::chrono::duration<double>(Clock::now() - run_start).count();
  phase_seconds();
  observer.sync_clocks(group.store());
  observer.startup().clocks = phase_seconds();
  const double before_data_mb = rss_mb();
  RankData data = load_rank_data(cfg, env, group.store(), group.timeout);
  memory.data_mb = std::max(0.0, rss_mb() - before_data_mb);
  observer.startup().data = phase_seconds();

  std::unique_ptr<Strategy> strategy_owner = make_strategy(cfg, device, group.comm.get());
  Strategy& strategy = *strategy_owner;
  const ModelShape shape{data.train_set->channels, data.train_set->height,
                         data.train_set->num_classes, data.train_set->width};
  std::unique_ptr<TrainModel> model = strategy.build_model(shape, group.batchnorm_comm.get());
  strategy.make_optimizer(*model);

  Checkpointer checkpointer(cfg, env);
  const TrainingPosition position = checkpointer.resume(*model, strategy);
  if ((position.epoch > 0 || position.mid_epoch.any()) && env.rank == 0) {
    std::printf("resumed from %s: epoch %d done, %lld steps", position.source.c_str(),
                position.epoch, static_cast<long long>(position.step));
    if (position.mid_epoch.any()) {
      std::printf(", %lld batches into epoch %d",
                  static_cast<long long>(position.mid_epoch.micro_step), position.epoch + 1);
    }
    // A world that shrank or grew (torchrun elastic, a requeue onto other nodes) says so.
    if (position.written_by > 0 && position.written_by != env.world_size) {
      std::printf("; written by %d rank%s, now %d", position.written_by,
                  position.written_by == 1 ? "" : "s", env.world_size);
    }
    std::printf("\n");
  }
  strategy.start_gradient_averaging(*model);
  if (cfg.data.global_batch_size > 0) {
    strategy.set_rank_share(cfg.data.batch_size, micro_batch_size(cfg));
  }
  observer.startup().model = phase_seconds();

  TrainStep step(train_step_options(cfg.train), std::move(precision), strategy,
                 LrSchedule(cfg.train.schedule, cfg.train.optimizer.lr,
                            total_optimizer_steps(cfg.train, data.train->num_batches())));
  EpochLoop loop(cfg, env,
                 EpochLoopParts{*model, strategy, step, *data.train, *data.test, checkpointer,
                                observer, device});
  hold_start_up_for_test(env.rank);
  // From here a stop signal is a request the training loop answers at its next step.
  StopRequest::steps_begin();
  try {
    loop.run(position);
  } catch (const CommError& e) {
    if (!loop.agreed_on_a_step() && stopped_before_any_step(e, ranks)) return kExitStopped;
    dump_flight_record(cfg, env, e.what());
    throw;
  }
  if (loop.stopped()) {
    say_stopped(*loop.stopped(), checkpointer, env.rank);
    return kExitStopped;
  }

  observer.write_trace(strategy.comm() ? strategy.comm()->name() : "none");
  memory.step_peak_bytes = step.step_peak_bytes();
  memory.held = strategy.memory(*model);
  gather_and_write_report(cfg, env, device, strategy, loop.compute_seconds(), loop.epochs(),
                          run_start, observer, loop.balance(),
                          device.is_cpu() ? std::optional<RankMemory>(memory) : std::nullopt);
  if (group.comm) group.comm->barrier();
  return 0;
}

}  // namespace

int run_worker(Config config, const WorkerEnv& env) {
  const auto run_start = Clock::now();
  // Until its first step a stop signal ends this rank at once; from there it is a request the
  // training loop answers at its next step (run_met_ranks()).
  StopRequest stop_request(/*in_start_up=*/true);
  // Before any tensor: the allocator that counts CPU tensor memory (the memory breakdown), and
  // the process as it stands, LibTorch loaded, before the run makes anything.
  count_cpu_tensor_memory();
  RankMemory memory;
  memory.floor_mb = rss_mb();
  // The ranks meet first: where one's config differs from rank 0's, all stop here, before
  // anything its config could make fail on it alone.
  const std::unique_ptr<comm::RankGroup> ranks = meet_ranks(config, env);
  // A stop in the rest of the start-up tells the others why this rank leaves them.
  if (ranks != nullptr) {
    stop_request.tell_on_start_up_stop(
        [group = ranks.get()](const std::string& why) { group->tell_stopped_aside(why); });
  }
  // Before `ranks` goes, whichever way this returns: the teller uses it.
  const struct StopTelling {
    ~StopTelling() { StopRequest::stop_telling(); }
  } stop_telling;
  // Out here, so that the communicators are still open while a rank that failed tells why.
  RankGroup group;
  try {
    return run_met_ranks(config, env, ranks.get(), group, run_start, memory);
  } catch (const CommError& e) {
    // Still in the start-up: a peer that stopped in its own.
    if (StopRequest::in_start_up() && stopped_before_any_step(e, ranks.get())) {
      return kExitStopped;
    }
    throw;  // a peer or the network failed: the others learn of it on their own side
  } catch (const std::exception& e) {
    // This rank's own failure (its device, data, model, disk): the others, which would find
    // it gone, give its reason too (comm::RankGroup::tell_stopped()).
    if (ranks != nullptr) ranks->tell_stopped(e.what());
    throw;
  }
}

}  // namespace partrain
