// Preemption on whole runs of the built executable: a stop signal mid-epoch saves that step
// and the same command continues to exactly the uninterrupted run's losses; step checkpoints
// survive a SIGKILL of a rank; a second signal during the stop's save ends the process and
// leaves the checkpoint before whole; one run per output folder; a frozen worker is killed; a
// stop in the start-up ends every rank at once.
#include <cstdio>

#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

// Two ranks, 75 steps an epoch, a step line every 2 steps (to see where the run is).
const char* kPairBody =
    "strategy: ddp\nlaunch: {nproc_per_node: 2}\ntrain: {epochs: 3, threads: 1, log_every: "
    "2}\n";
const std::vector<std::string> kPairSets = {"--set", "data.synthetic_train=4800", "--set",
                                            "checkpoint.resume=auto"};

std::vector<std::string> run_args(const fs::path& cfg, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"run", cfg.string()};
  args.insert(args.end(), kPairSets.begin(), kPairSets.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string joined(const std::vector<std::string>& args) {
  std::string text;
  for (std::size_t i = 1; i < args.size(); ++i) text += (i > 1 ? " " : "") + args[i];
  return "run " + text;
}

// The losses of metrics.jsonl's step lines, in order.
std::vector<double> step_losses(const fs::path& dir) {
  std::vector<double> losses;
  std::ifstream in(dir / "out" / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line);
    if (j.value("type", "") == "step") losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

fs::path straight_pair_run(const std::string& name, std::vector<std::string> extra = {}) {
  auto dir = scratch(name);
  const auto args = run_args(write_config(dir, kPairBody), std::move(extra));
  const Result r = partrain(joined(args), dir);
  EXPECT_EQ(r.code, 0) << r.output;
  return dir;
}

// Starts `partrain run ARGS` with the test variable `name` set to `value` for it alone.
pid_t start_with(const std::vector<std::string>& args, const fs::path& log, const char* name,
                 const std::string& value) {
  ScopedEnv set(name, value);
  return start_partrain(args, log);
}

TEST(Preemption, SigtermMidEpochSavesTheStepAndTheSameCommandContinuesExactly) {
  const fs::path straight = straight_pair_run("stop_straight");
  auto dir = scratch("stop");
  const auto args = run_args(write_config(dir, kPairBody));
  const fs::path log = dir / "first.txt";
  // Rank 0 waits 10 ms before each batch (no number changes), so that the stop, a poll of the
  // test's and one of the launcher's away, lands inside epoch 2 on a fast machine too.
  const pid_t launcher = start_with(args, log, "PARTRAIN_TEST_STEP_DELAY", "0:0.01");
  ASSERT_TRUE(wait_for_text(log, "epoch 2/3 step 11/", std::chrono::seconds(120)))
      << read_text(log);
  kill(launcher, SIGTERM);
  const auto status = wait_exit(launcher, std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value()) << read_text(log);
  const std::string first = read_text(log);
  ASSERT_TRUE(WIFEXITED(*status)) << first;
  EXPECT_EQ(WEXITSTATUS(*status), 75) << first;  // kExitStopped
  EXPECT_NE(first.find("by SIGTERM; run the same command to continue"), std::string::npos) << first;
  // Stopped mid-epoch 2: the checkpoint of that step, named for it, is the newest.
  const std::string manifest = read_text(dir / "out" / "checkpoints" / "latest.json");
  EXPECT_NE(manifest.find("epoch-0001.step-"), std::string::npos) << manifest;
  EXPECT_FALSE(fs::exists(dir / "out" / "report.json"));

  const Result second = partrain(joined(args), dir);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("batches into epoch 2"), std::string::npos) << second.output;
  EXPECT_EQ(epoch_losses(dir), epoch_losses(straight));
  EXPECT_EQ(step_losses(dir), step_losses(straight));
  EXPECT_FALSE(fs::exists(dir / "out" / "partrain.lock"));  // released at each exit
}

// strategy single trains in the `partrain run` process itself: it answers the signal alone.
TEST(Preemption, SingleProcessStopsAtASignalAndContinuesExactly) {
  const std::string body = "strategy: single\ntrain: {epochs: 3, threads: 1, log_every: 2}\n";
  auto straight = scratch("single_straight");
  const auto straight_args = run_args(write_config(straight, body));
  ASSERT_EQ(partrain(joined(straight_args), straight).code, 0);
  auto dir = scratch("single_stop");
  const auto args = run_args(write_config(dir, body));
  const fs::path log = dir / "first.txt";
  const pid_t run = start_partrain(args, log);
  // 150 batches an epoch: batch 10 of epoch 2 is step 160, which has a line.
  ASSERT_TRUE(wait_for_text(log, "epoch 2/3 step 10/", std::chrono::seconds(120)))
      << read_text(log);
  kill(run, SIGUSR1);
  const auto status = wait_exit(run, std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 75) << read_text(log);
  EXPECT_NE(read_text(log).find("by SIGUSR1; saved "), std::string::npos) << read_text(log);
  const Result second = partrain(joined(args), dir);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_EQ(epoch_losses(dir), epoch_losses(straight));
  EXPECT_EQ(step_losses(dir), step_losses(straight));
}

// Sends `signal` to `signalled`, waits up to `bound` for the run `waited` (which may be the
// same process) to exit, and expects kExitStopped; `out` gets what the run printed, `took` the
// seconds from the signal to the exit.
void expect_ends_stopped(pid_t signalled, int signal, pid_t waited, std::chrono::seconds bound,
                         const fs::path& log, std::string& out, double& took) {
  const auto start = std::chrono::steady_clock::now();
  kill(signalled, signal);
  const auto status = wait_exit(waited, bound);
  took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out = read_text(log);
  ASSERT_TRUE(status.has_value()) << out;
  ASSERT_TRUE(WIFEXITED(*status)) << out;
  EXPECT_EQ(WEXITSTATUS(*status), 75) << out;
}

// Sends `signal` to `pid`, a run held in its start-up far longer than 10 s, and expects it to
// end within 10 s with kExitStopped; `out` gets what the run printed.
void expect_stopped_at_once(pid_t pid, int signal, const fs::path& log, std::string& out) {
  double took = 0;
  ASSERT_NO_FATAL_FAILURE(
      expect_ends_stopped(pid, signal, pid, std::chrono::seconds(30), log, out, took));
  EXPECT_LT(took, 10.0) << out;
}

// `partrain run` training one rank in its own process ends at once at a stop in its start-up,
// as a worker does: exit 75 with its line, the output folder's lock removed, nothing saved.
// Without that the stop would wait for the 60 s hold and a step.
TEST(Preemption, ASingleProcessRunStoppedInItsStartUpEndsAtOnce) {
  auto dir = scratch("single_start_up_stop");
  const auto args =
      run_args(write_config(dir, "strategy: single\ntrain: {epochs: 3, threads: 1}\n"));
  const fs::path log = dir / "first.txt";
  const pid_t run = start_with(args, log, "PARTRAIN_TEST_START_DELAY", "0:60");
  ASSERT_TRUE(wait_for_text(log, "rank 0 holds its start-up", std::chrono::seconds(120)))
      << read_text(log);
  EXPECT_TRUE(fs::exists(dir / "out" / "partrain.lock"));
  std::string out;
  ASSERT_NO_FATAL_FAILURE(expect_stopped_at_once(run, SIGINT, log, out));
  EXPECT_NE(out.find("partrain: stopped during start-up by SIGINT; run the same command to "
                     "continue"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir / "out" / "partrain.lock"));
  EXPECT_FALSE(fs::exists(dir / "out" / "checkpoints" / "latest.json"));
}

TEST(Preemption, StepCheckpointsSurviveASigkilledRankAndLeaveTheBitsAlone) {
  const fs::path straight = straight_pair_run("steps_straight");
  auto dir = scratch("steps");
  const auto args = run_args(write_config(dir, kPairBody),
                             {"--set", "checkpoint.every_steps=20", "--set", "checkpoint.keep=3"});
  const fs::path log = dir / "first.txt";
  // Rank 0 waits 20 ms before each batch (no number changes): the kill lands before epoch 2's
  // own checkpoint on a fast machine too, so the newest is a step checkpoint.
  const pid_t launcher = start_with(args, log, "PARTRAIN_TEST_STEP_DELAY", "0:0.02");
  // Epoch 2 has passed step 100 (a step checkpoint) and gone on (log lines come at even steps:
  // batch 41 of epoch 2 is step 116).
  ASSERT_TRUE(wait_for_text(log, "epoch 2/3 step 41/", std::chrono::seconds(120)))
      << read_text(log);
  const pid_t victim = find_worker(launcher, 1);
  ASSERT_GT(victim, 0);
  kill(victim, SIGKILL);
  const auto status = wait_exit(launcher, std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value());
  EXPECT_NE(WEXITSTATUS(*status), 0);
  const std::string manifest = read_text(dir / "out" / "checkpoints" / "latest.json");
  EXPECT_NE(manifest.find(".step-"), std::string::npos) << manifest;
  int checkpoints = 0;
  for (const auto& entry : fs::directory_iterator(dir / "out" / "checkpoints")) {
    const std::string name = entry.path().filename().string();
    checkpoints += name.rfind("epoch-", 0) == 0 ? 1 : 0;
  }
  EXPECT_LE(checkpoints, 3);  // keep counts step and epoch checkpoints together

  const Result second = partrain(joined(args), dir);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_EQ(epoch_losses(dir), epoch_losses(straight));
  EXPECT_EQ(step_losses(dir), step_losses(straight));
}

TEST(Preemption, ASecondRunIsRefusedTheFolderAndAStaleLockIsTakenOver) {
  auto dir = scratch("lock");
  const fs::path cfg = write_config(dir, "strategy: single\ntrain: {epochs: 1, threads: 1}\n");
  fs::create_directories(dir / "out");
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const fs::path lock = dir / "out" / "partrain.lock";
  // Held by this (live) test process for another run.
  std::ofstream(lock) << "host=" << host << "\npid=" << getpid()
                      << "\nsince=2026-01-01T00:00:00Z\ntoken=another-run\n";
  const Result refused = partrain("run " + cfg.string(), dir);
  EXPECT_EQ(refused.code, 2) << refused.output;
  EXPECT_NE(refused.output.find("is in use by another run: pid " + std::to_string(getpid()) +
                                " on host " + host + " since 2026-01-01T00:00:00Z"),
            std::string::npos)
      << refused.output;
  EXPECT_FALSE(fs::exists(dir / "out" / "report.json"));
  // A worker started by an engine (here by hand, as torchrun would) takes the lock too.
  const Result worker = partrain("worker " + cfg.string(), dir);
  EXPECT_EQ(worker.code, 2) << worker.output;
  EXPECT_NE(worker.output.find("is in use by another run: pid " + std::to_string(getpid())),
            std::string::npos)
      << worker.output;

  // Held by a process that is gone: taken over, said so, released at the end.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  std::ofstream(lock) << "host=" << host << "\npid=" << child
                      << "\nsince=2026-01-01T00:00:00Z\ntoken=dead-run\n";
  const Result taken = partrain("run " + cfg.string(), dir);
  EXPECT_EQ(taken.code, 0) << taken.output;
  EXPECT_NE(taken.output.find("locked by pid " + std::to_string(child)), std::string::npos)
      << taken.output;
  EXPECT_NE(taken.output.find("taking the stale lock over"), std::string::npos) << taken.output;
  EXPECT_FALSE(fs::exists(lock));
}

// Starts a pair run in `dir`, its output to `log`, and waits until rank 0 holds at the end of
// its start-up (for 60 s, PARTRAIN_TEST_START_DELAY) while rank 1 waits for it in its first
// step. The launcher's pid; 0, with the run killed, where it did not get there.
pid_t start_pair_held_in_start_up(const fs::path& dir, const fs::path& log) {
  const pid_t launcher =
      start_with(run_args(write_config(dir, kPairBody)), log, "PARTRAIN_TEST_START_DELAY", "0:60");
  if (wait_for_text(log, "rank 0 holds its start-up", std::chrono::seconds(120)) &&
      wait_for_text(log, "[rank 1] epoch 1/3", std::chrono::seconds(60))) {
    return launcher;
  }
  kill(launcher, SIGKILL);
  wait_exit(launcher, std::chrono::seconds(30));
  return 0;
}

// A stop before the first step ends every rank at once: nothing is saved, and no rank is left
// to the launcher's SIGKILL. Rank 0 holds at the end of its start-up for 60 s, while rank 1
// waits for it in its first step: rank 0 ends at the forwarded SIGTERM in its start-up, and
// rank 1, asked to stop before any step was agreed, takes the lost peer as the same stop.
// Without that the run would end after rank 0's hold or at the grace's SIGKILL.
TEST(Preemption, AStopInTheStartUpEndsEveryRankAtOnce) {
  auto dir = scratch("start_up_stop");
  const fs::path log = dir / "first.txt";
  const pid_t launcher = start_pair_held_in_start_up(dir, log);
  ASSERT_GT(launcher, 0) << read_text(log);
  std::string out;
  ASSERT_NO_FATAL_FAILURE(expect_stopped_at_once(launcher, SIGINT, log, out));
  for (const char* rank : {"[rank 0] ", "[rank 1] "}) {
    EXPECT_NE(out.find(std::string(rank) + "partrain: stopped during start-up by SIGTERM"),
              std::string::npos)
        << out;
  }
  EXPECT_NE(out.find("partrain: stopped during start-up by SIGINT; run the same command to "
                     "continue"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("SIGKILL"), std::string::npos) << out;
  EXPECT_EQ(out.find("at failure"), std::string::npos) << out;  // no flight record: not a failure
  EXPECT_FALSE(fs::exists(dir / "out" / "checkpoints" / "latest.json"));
  EXPECT_FALSE(fs::exists(dir / "out" / "partrain.lock"));
}

// SIGTERM to rank `stopped`'s worker alone, of the pair `launcher` runs: the run ends as
// stopped in its start-up, on both ranks, with nothing saved and no rank failed.
void expect_a_stop_to_one_rank_stops_the_run(pid_t launcher, int stopped, const fs::path& dir,
                                             const fs::path& log) {
  const pid_t worker = find_worker(launcher, stopped);
  ASSERT_GT(worker, 0);
  std::string out;
  double took = 0;
  ASSERT_NO_FATAL_FAILURE(
      expect_ends_stopped(worker, SIGTERM, launcher, std::chrono::seconds(60), log, out, took));
  const std::string rank = std::to_string(stopped), other = std::to_string(1 - stopped);
  EXPECT_NE(out.find("[rank " + rank + "] partrain: stopped during start-up by SIGTERM; run"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("[rank " + other + "] partrain: stopped during start-up by SIGTERM to rank " +
                     rank + "; run"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("partrain: stopped during start-up by a stop signal to one of the ranks; "
                     "run the same command to continue"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("at failure"), std::string::npos) << out;
  EXPECT_EQ(out.find("lost rank"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "out" / "checkpoints" / "latest.json"));
}

// A stop to one rank alone in its start-up stops the run as a whole, as a stop to one rank
// does at a step: the rank tells the others why before it ends, and a rank that loses it takes
// that as the same stop. Rank 0 holds at the end of its start-up; SIGTERM goes to its worker
// alone, while rank 1 waits for it in its first step.
TEST(Preemption, ARankStoppedAloneInItsStartUpStopsTheRun) {
  auto dir = scratch("start_up_stop_alone");
  const fs::path log = dir / "first.txt";
  const pid_t launcher = start_pair_held_in_start_up(dir, log);
  ASSERT_GT(launcher, 0) << read_text(log);
  expect_a_stop_to_one_rank_stops_the_run(launcher, 0, dir, log);
}

// A rank whose steps began when its own stop came, but which cannot agree on a step since a
// peer is still in its start-up, ends when its collective times out; it tells the others why
// first, so the peer, finding it gone on its way to the first step, takes that as the same stop
// instead of a failure. Rank 0 holds its start-up for 15 s; SIGTERM goes to rank 1 alone, in
// its first step, whose allreduce gives up after comm.timeout_s = 5 (the signal must come
// before that: 5 s for the log line to reach the test and the test's signal on a busy host).
TEST(Preemption, ARankStoppedAloneAtItsFirstStepTellsTheOthers) {
  auto dir = scratch("first_step_stop_alone");
  const fs::path log = dir / "first.txt";
  const pid_t launcher =
      start_with(run_args(write_config(dir, kPairBody), {"--set", "comm.timeout_s=5"}), log,
                 "PARTRAIN_TEST_START_DELAY", "0:15");
  ASSERT_TRUE(wait_for_text(log, "rank 0 holds its start-up", std::chrono::seconds(120)) &&
              wait_for_text(log, "[rank 1] epoch 1/3", std::chrono::seconds(60)))
      << read_text(log);
  expect_a_stop_to_one_rank_stops_the_run(launcher, 1, dir, log);
}

// A worker frozen by SIGSTOP writes nothing, not even its heartbeat: its launcher kills it
// after comm.timeout_s plus the grace, names it, and (here) restarts the group, which resumes.
TEST(Preemption, AFrozenWorkerIsKilledAndNamed) {
  auto dir = scratch("frozen");
  const fs::path cfg = write_config(
      dir,
      "strategy: ddp\nlaunch: {nproc_per_node: 1, max_restarts: 1}\ntrain: {epochs: 2, "
      "threads: 1, log_every: 2}\n");
  const fs::path log = dir / "first.txt";
  const pid_t launcher =
      start_partrain({"run", cfg.string(), "--set", "comm.timeout_s=2", "--set",
                      "data.synthetic_train=4800", "--set", "checkpoint.resume=auto"},
                     log);
  ASSERT_TRUE(wait_for_text(log, "epoch 2/2 step 10/", std::chrono::seconds(120)))
      << read_text(log);
  const pid_t victim = find_worker(launcher, 0);
  ASSERT_GT(victim, 0);
  kill(victim, SIGSTOP);
  const auto status = wait_exit(launcher, std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value()) << read_text(log);
  const std::string out = read_text(log);
  EXPECT_EQ(WEXITSTATUS(*status), 0) << out;  // the restart finished the run
  EXPECT_NE(out.find("partrain: rank 0 (pid " + std::to_string(victim) + ") wrote nothing for"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("restarting the group (restart 1 of 1) after rank 0 was killed by signal 9"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("it was frozen"), std::string::npos) << out;
  EXPECT_NE(out.find("it is frozen: its process is stopped (SIGSTOP or SIGTSTP); SIGKILL"),
            std::string::npos)
      << out;
  // The restart's line, the verdict on the group that failed, says it again.
  EXPECT_NE(out.find(" s; its process was stopped (SIGSTOP or SIGTSTP))"), std::string::npos)
      << out;
}

// The newest entry of OUT/checkpoints whose name holds `part`, or "".
std::string checkpoint_file_with(const fs::path& dir, const std::string& part) {
  std::string found;
  for (const auto& entry : fs::directory_iterator(dir / "out" / "checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.find(part) != std::string::npos && name > found) found = name;
  }
  return found;
}

// A second signal while the stop's checkpoint is written ends the process at once, by that
// signal (the first one only asks for the save). The save is held open between its temp file
// and the rename (PARTRAIN_TEST_STOP_SAVE_DELAY, 20 s) so that the second signal lands in it:
// without the "now" rule the process would finish the save and exit 75 after the delay. The
// checkpoint before stays named in latest.json, whole, and the same command continues from it
// to the uninterrupted run's losses.
TEST(Preemption, ASecondSignalDuringTheStopSaveEndsAtOnceAndKeepsThePreviousCheckpoint) {
  const std::string body = "strategy: single\ntrain: {epochs: 2, threads: 1, log_every: 2}\n";
  auto straight = scratch("second_signal_straight");
  ASSERT_EQ(partrain(joined(run_args(write_config(straight, body))), straight).code, 0);
  auto dir = scratch("second_signal");
  const auto args = run_args(write_config(dir, body), {"--set", "checkpoint.every_steps=20"});
  const fs::path log = dir / "first.txt";
  // The stop's save waits 20 s before its rename; each batch waits 10 ms (no number changes),
  // so that the first signal lands well before the step-180 checkpoint, whose save would
  // otherwise be the one held.
  const pid_t run = [&] {
    ScopedEnv hold("PARTRAIN_TEST_STOP_SAVE_DELAY", "0:20");
    ScopedEnv delay("PARTRAIN_TEST_STEP_DELAY", "0:0.01");
    return start_partrain(args, log);
  }();
  // 150 batches an epoch: batch 12 of epoch 2 is step 162, past the step-160 checkpoint.
  ASSERT_TRUE(wait_for_text(log, "epoch 2/2 step 12/", std::chrono::seconds(120)))
      << read_text(log);
  kill(run, SIGUSR1);
  const auto first_signal = Clock::now();
  // The stop's save has written its temp file and waits before the rename.
  const fs::path checkpoints = dir / "out" / "checkpoints";
  std::string temp;
  for (auto end = Clock::now() + std::chrono::seconds(30); temp.empty() && Clock::now() < end;) {
    temp = checkpoint_file_with(dir, ".tmp-");
    if (temp.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(temp.empty()) << "the stop's save never started\n" << read_text(log);
  const std::string manifest_before = read_text(checkpoints / "latest.json");
  kill(run, SIGUSR1);
  const auto second_after = std::chrono::duration<double>(Clock::now() - first_signal).count();
  const auto status = wait_exit(run, std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value()) << "still saving 5 s after the second signal (sent "
                                  << second_after << " s after the first)\n"
                                  << read_text(log);
  // Within StopRequest's 2 s window the "now" comes from set_saving alone.
  std::printf("second signal %.2f s after the first\n", second_after);
  ASSERT_TRUE(WIFSIGNALED(*status)) << "status " << *status << "\n" << read_text(log);
  EXPECT_EQ(WTERMSIG(*status), SIGUSR1);
  // The half-written one never got its name; latest.json still names the one before.
  const std::string stopped_at = temp.substr(0, temp.find(".tmp-"));
  EXPECT_FALSE(fs::exists(checkpoints / stopped_at)) << stopped_at;
  EXPECT_EQ(read_text(checkpoints / "latest.json"), manifest_before);
  EXPECT_NE(manifest_before.find("epoch-0001.step-"), std::string::npos) << manifest_before;
  EXPECT_EQ(manifest_before.find(stopped_at), std::string::npos) << manifest_before;

  const Result second = partrain(joined(args), dir);
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  EXPECT_NE(second.output.find("batches into epoch 2"), std::string::npos) << second.output;
  EXPECT_EQ(checkpoint_file_with(dir, ".tmp-"), "");  // the leftover went with the next save
  EXPECT_EQ(epoch_losses(dir), epoch_losses(straight));
  EXPECT_EQ(step_losses(dir), step_losses(straight));
}

}  // namespace
