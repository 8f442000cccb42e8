// Faults and broken input on whole runs: SIGKILL at any moment then resume (the losses of an
// uninterrupted run, exactly), a group restart after a rank dies, checkpoints that do not
// fit, a rank that never arrives, a port in use, a rendezvous directory that cannot exist, an
// output folder whose disk fills up.
#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

const char* kBody = "strategy: single\ntrain: {epochs: 6, threads: 1}\n";

// Runs `body` straight through, then again killed (SIGKILL) at a spread of moments and
// resumed until it completes: the epochs' losses must be the same, exactly.
void expect_kills_resume_to_the_same_losses(const std::string& name, const std::string& body) {
  auto straight = scratch(name + "_straight");
  const auto started = std::chrono::steady_clock::now();
  ASSERT_EQ(partrain("run " + write_config(straight, body).string(), straight).code, 0);
  const auto straight_time = std::chrono::steady_clock::now() - started;
  const auto expected = epoch_losses(straight);
  ASSERT_EQ(expected.size(), 6u);

  // Kill the run at a spread of moments — during start-up, training, evaluation and the
  // checkpoint write — then resume until it completes. The moments are shares of the straight
  // run's time, so that they fall inside the run on a fast machine as on a slow one: together
  // they come to 0.7 of it, and every attempt starts up again, so at an even pace each kill
  // lands before the run is done (three must, to allow for a machine whose pace changes).
  auto dir = scratch(name + "_killed");
  auto cfg = write_config(dir, body);
  int kills = 0;
  for (double share : {0.05, 0.1, 0.15, 0.2, 0.2}) {
    pid_t pid = start_partrain({"run", cfg.string(), "--set", "checkpoint.resume=auto"},
                               dir / "attempt.txt");
    std::this_thread::sleep_for(
        std::chrono::duration_cast<std::chrono::milliseconds>(straight_time * share));
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == 0) {  // still running: this kill interrupts it
      kill(pid, SIGKILL);
      ++kills;
      wait_exit(pid, std::chrono::seconds(30));
    }
  }
  EXPECT_GE(kills, 3);
  // Leftovers a crash can leave: a half-written temp file and an orphan checkpoint that no
  // manifest names. Neither may be taken for a checkpoint.
  fs::create_directories(dir / "out" / "checkpoints");
  std::ofstream(dir / "out" / "checkpoints" / "epoch-0099.pt.tmp.1") << "half a checkpoint";
  Result r = partrain("run " + cfg.string() + " --set checkpoint.resume=auto", dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(epoch_losses(dir), expected);
}

TEST(Reliability, KilledAtAnyMomentResumesToTheSameLosses) {
  expect_kills_resume_to_the_same_losses("sgd", kBody);
}

// AdamW's moments and step counts, the place in a warmup-then-cosine schedule (which spans the
// kills), label smoothing and clipping: all of it must come back from the checkpoint.
TEST(Reliability, AdamWCosineWarmupKilledAndResumedEqualsTheStraightRun) {
  expect_kills_resume_to_the_same_losses(
      "adamw",
      "strategy: single\ntrain: {epochs: 6, threads: 1, label_smoothing: 0.1, "
      "clip_grad_norm: 1.0, optimizer: {name: adamw, lr: 0.003, weight_decay: 0.05}, "
      "schedule: {name: cosine, warmup_steps: 50, min_lr: 0.0001}}\n");
}

TEST(Reliability, RestartResumesTheGroupAfterARankDies) {
  auto straight = scratch("restart_straight"), dir = scratch("restart");
  const std::string body =
      "strategy: ddp\nlaunch: {nproc_per_node: 2, max_restarts: 1}\ntrain: {epochs: 3, threads: "
      "1}\n";
  ASSERT_EQ(
      partrain("run " + write_config(straight, body).string() + " --set comm.backend=asio-ring",
               straight)
          .code,
      0);
  auto cfg = write_config(dir, body);
  fs::path log = dir / "output.txt";
  // Rank 0 waits 20 ms before each batch (no number changes), so that rank 1 is still there to
  // be killed on a fast machine too.
  const pid_t launcher = [&] {
    ScopedEnv delay("PARTRAIN_TEST_STEP_DELAY", "0:0.02");
    return start_partrain(
        {"run", cfg.string(), "--set", "comm.backend=asio-ring", "--set", "checkpoint.resume=auto"},
        log);
  }();
  // After the first epoch's checkpoint, rank 1 dies.
  ASSERT_TRUE(wait_for_text(log, "epoch 2/3", std::chrono::seconds(120)));
  pid_t victim = find_worker(launcher, 1);
  ASSERT_GT(victim, 0);
  kill(victim, SIGKILL);
  auto status = wait_exit(launcher, std::chrono::seconds(180));
  ASSERT_TRUE(status.has_value());
  std::string output = read_text(log);
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << output;
  EXPECT_NE(output.find("restart 1 of 1"), std::string::npos) << output;
  EXPECT_NE(output.find("resumed from"), std::string::npos) << output;
  EXPECT_EQ(epoch_losses(dir), epoch_losses(straight));
}

TEST(Reliability, BadSettingsAreNotRetried) {
  auto dir = scratch("restart_out");
  // A rank that cannot start (its rendezvous directory is a file) fails every attempt.
  auto blocker = dir / "not_a_dir";
  std::ofstream(blocker) << "x";
  auto cfg = write_config(
      dir, "strategy: ddp\nlaunch: {nproc_per_node: 2, max_restarts: 2}\ntrain: {epochs: 1}\n");
  Result r = partrain(
      "run " + cfg.string() + " --set launch.rendezvous=file://" + (blocker / "sub").string(), dir,
      120);
  // Bad settings are not retried: exit 2 at once, with the reason.
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("not_a_dir"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restarting"), std::string::npos) << r.output;
}

TEST(Reliability, CheckpointThatDoesNotFitIsRefused) {
  auto dir = scratch("misfit");
  auto cfg = write_config(dir, "strategy: single\ntrain: {epochs: 1, threads: 1}\n");
  ASSERT_EQ(partrain("run " + cfg.string(), dir).code, 0);
  Result r = partrain("run " + cfg.string() +
                          " --set checkpoint.resume=auto --set train.epochs=2 --set model.width=16",
                      dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("was written for another model"), std::string::npos) << r.output;

  // The manifest names a file that is gone.
  fs::remove(dir / "out" / "checkpoints" / "epoch-0001.pt");
  r = partrain("run " + cfg.string() + " --set checkpoint.resume=auto --set train.epochs=2", dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;

  // A truncated checkpoint named directly.
  auto bad = dir / "truncated.pt";
  std::ofstream(bad) << "PK\x03\x04 not a whole archive";
  r = partrain("run " + cfg.string() + " --set checkpoint.resume=" + bad.string(), dir);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("cannot be read"), std::string::npos) << r.output;
}

TEST(Reliability, RankThatNeverArrivesIsNamedWithinTheBound) {
  auto dir = scratch("absent");
  auto cfg = write_config(dir, "strategy: ddp\ntrain: {epochs: 1}\n");
  auto start = Clock::now();
  std::string cmd = "RANK=0 WORLD_SIZE=2 PARTRAIN_RENDEZVOUS=file://" + (dir / "rdzv").string() +
                    " " + exe() + " worker " + cfg.string() +
                    " --set comm.timeout_s=2 --set comm.backend=asio-ring > " +
                    (dir / "output.txt").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_LT(seconds, 2 * 2.0 + 5.0);  // the bound, plus start-up
  std::string output = read_text(dir / "output.txt");
  EXPECT_NE(output.find("rank 1"), std::string::npos) << output;
}

// Ranks an engine started, each reading its own config. Keys every rank must hold alike that
// differ (the learning rate given to rank 1 alone, which trained before with rank 1's
// parameters drifting from rank 0's, and the backend, which waited out the timeout) stop every
// rank at once with one line naming rank 1 and the keys (exit 2): through a file store, and
// through the tcp store rank 0 hosts, which must serve until the others have read the line (4
// ranks, so three read it while rank 0 would be leaving), and before rank 1 tries a global batch
// it alone cannot split. Keys a host may set its own way (data.root, train.threads, output.dir)
// do not stop them.
TEST(Reliability, RanksOfAnotherConfigAreNamedBeforeTheyTrain) {
  auto dir = scratch("config_agreement");
  auto cfg = write_config(dir, "strategy: ddp\ntrain: {epochs: 1, max_steps: 2}\n");
  const std::string differ = " --set train.optimizer.lr=0.1 --set comm.backend=shm";
  for (const auto& [name, rendezvous, world] :
       {std::tuple{"file", "file://" + (dir / "rdzv").string(), 2},
        std::tuple{"tcp", "tcp://127.0.0.1:" + std::to_string(unused_port()), 4}}) {
    SCOPED_TRACE(name);
    const EngineRanks differing = run_engine_ranks(dir, cfg, name, rendezvous, world, 1, differ);
    for (const auto& [code, output] : differing.ranks) {
      EXPECT_EQ(code, 2) << output;
      EXPECT_NE(output.find("rank 1 runs another config than rank 0: comm.backend is \"shm\" on "
                            "rank 1 and \"auto\" on rank 0; train.optimizer.lr is 0.1 on "
                            "rank 1 and 0.05 on rank 0: start every rank with the same config"),
                std::string::npos)
          << output;
    }
    EXPECT_LT(differing.seconds, 30.0);  // at once, not at the 60 s timeout
  }
  // A global batch that rank 1 alone cannot split would stop rank 1 while it resolves its share:
  // the ranks meet before that, so both stop at the difference.
  const EngineRanks unsplit =
      run_engine_ranks(dir, cfg, "unsplit", "file://" + (dir / "rdzv-unsplit").string(), 2, 1,
                       " --set data.batch_size=null --set data.global_batch_size=7");
  for (const auto& [code, output] : unsplit.ranks) {
    EXPECT_EQ(code, 2) << output;
    EXPECT_NE(output.find("data.global_batch_size is 7 on rank 1 and null on rank 0"),
              std::string::npos)
        << output;
  }
  EXPECT_LT(unsplit.seconds, 30.0);
  const EngineRanks agreeing = run_engine_ranks(
      dir, cfg, "agreeing", "file://" + (dir / "rdzv-agreeing").string(), 2, 1,
      " --set data.root=/elsewhere --set train.threads=2 --set data.num_workers=2");
  for (const auto& [code, output] : agreeing.ranks) EXPECT_EQ(code, 0) << output;
}

// A rank that stops before it meets the others — a config it cannot load (here a setting out of
// range; a file missing on its host is the same), or one it loads but cannot run with the others
// (strategy single) — leaves its reason in the store: every rank stops at once with that line
// (exit 2), naming the rank, instead of waiting out comm.timeout_s (60 s here; 300 s by
// default) at the config check. Rank 0, which hosts the tcp store, tells the others too.
TEST(Reliability, ARankThatStopsBeforeMeetingTheOthersIsNamedByAll) {
  auto dir = scratch("stopped_before_meeting");
  auto cfg = write_config(dir, "strategy: ddp\ntrain: {epochs: 1, max_steps: 2}\n");
  const std::string tcp = "tcp://127.0.0.1:";
  for (const auto& [name, rendezvous, world, odd, sets, why] :
       {std::tuple{"unloadable", tcp + std::to_string(unused_port()), 3, 1,
                   std::string(" --set train.epochs=-3"),
                   std::string("--set train.epochs=-3: train.epochs: -3 is out of range")},
        std::tuple{"rank0", tcp + std::to_string(unused_port()), 3, 0,
                   std::string(" --set train.epochs=-3"),
                   std::string("--set train.epochs=-3: train.epochs: -3 is out of range")},
        std::tuple{"single", "file://" + (dir / "rdzv-single").string(), 2, 1,
                   std::string(" --set strategy=single"),
                   std::string("strategy single runs in one process, but the launch has 2 "
                               "ranks")}}) {
    SCOPED_TRACE(name);
    const EngineRanks stopped = run_engine_ranks(dir, cfg, name, rendezvous, world, odd, sets);
    for (const auto& [code, output] : stopped.ranks) {
      EXPECT_EQ(code, 2) << output;
      EXPECT_NE(output.find(why), std::string::npos) << output;
    }
    // The odd rank says its own error; the others say it came from that rank.
    for (int rank = 0; rank < world; ++rank) {
      if (rank == odd) continue;
      const std::string& output = stopped.ranks[rank].second;
      EXPECT_NE(output.find("rank " + std::to_string(odd) + " ("), std::string::npos) << output;
      EXPECT_NE(output.find(") stopped before meeting the others: " + why), std::string::npos)
          << output;
    }
    EXPECT_LT(stopped.seconds, 30.0);  // at once, not at the 60 s timeout
  }
}

// Bytes a file system of 4 KiB blocks gives the files and folders under `dir`.
std::uintmax_t blocks_used(const fs::path& dir) {
  std::uintmax_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    bytes += entry.is_regular_file() ? (entry.file_size() + 4095) / 4096 * 4096 : 4096;
  }
  return bytes;
}

// The output folder on a tmpfs with room for one epoch's files and half a checkpoint more:
// the second epoch's checkpoint does not fit. Both ranks stop, with the write's error named
// and no crash, no temp file is left, and the first checkpoint is whole: the run resumes from
// it elsewhere.
TEST(Reliability, AFullDiskStopsTheRunAndKeepsWhatWasWritten) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  const std::string body = "strategy: ddp\ntrain: {epochs: 1, threads: 1}\n";
  auto ref = scratch("disk_full_ref");
  auto ref_cfg = write_config(ref, body);
  ASSERT_EQ(partrain("run " + ref_cfg.string() + " --nproc-per-node 2", ref).code, 0);
  const std::uintmax_t checkpoint = fs::file_size(ref / "out" / "checkpoints" / "epoch-0001.pt");
  const std::uintmax_t room = blocks_used(ref / "out") + checkpoint / 2;

  auto dir = scratch("disk_full");
  const fs::path out = dir / "out";
  fs::create_directories(out);
  const std::string mount = "mount -t tmpfs -o size=" + std::to_string(room / 4096 * 4096 + 4096) +
                            " partrain-test-full " + out.string() + " 2>/dev/null";
  if (std::system(mount.c_str()) != 0) GTEST_SKIP() << "cannot mount a tmpfs here";
  struct Unmount {
    fs::path at;
    ~Unmount() { (void)std::system(("umount -l " + at.string()).c_str()); }
  } unmount{out};

  auto cfg = write_config(dir, body);
  Result r = partrain("run " + cfg.string() + " --nproc-per-node 2 --set train.epochs=2", dir);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, -1) << "the run did not end within the bound: " << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("SIGABRT"), std::string::npos) << r.output;
  for (const auto& entry : fs::directory_iterator(out / "checkpoints")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos)
        << "left behind: " << entry.path();
  }

  auto resumed = scratch("disk_full_resumed");
  fs::copy(out, resumed / "out", fs::copy_options::recursive);
  auto resumed_cfg = write_config(resumed, body);
  r = partrain("run " + resumed_cfg.string() +
                   " --nproc-per-node 2 --set train.epochs=2 --set checkpoint.resume=auto",
               resumed);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("epoch 1 done"), std::string::npos) << r.output;
}

TEST(Reliability, PortInUseAndUnusableRendezvousExitTwo) {
  auto dir = scratch("port");
  auto cfg = write_config(dir, "strategy: ddp\ntrain: {epochs: 1}\n");
  // Hold a port, then ask rank 0 to host the tcp store on it.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  std::string cmd =
      "RANK=0 WORLD_SIZE=2 PARTRAIN_RENDEZVOUS=tcp://127.0.0.1:" + std::to_string(port) + " " +
      exe() + " worker " + cfg.string() + " > " + (dir / "output.txt").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  close(fd);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  std::string output = read_text(dir / "output.txt");
  EXPECT_NE(output.find("already in use"), std::string::npos) << output;

  cmd = "RANK=0 WORLD_SIZE=2 PARTRAIN_RENDEZVOUS=file:///proc/partrain-cannot-be-here " + exe() +
        " worker " + cfg.string() + " > " + (dir / "output.txt").string() + " 2>&1";
  status = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  output = read_text(dir / "output.txt");
  EXPECT_NE(output.find("/proc/partrain-cannot-be-here"), std::string::npos) << output;
}

}  // namespace
