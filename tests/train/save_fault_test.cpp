// A process that dies (SIGKILL, no cleanup) at each step of a checkpoint save: what it leaves
// on disk must be resumable — latest.json names a whole checkpoint, the previous one is intact,
// a temp file is never taken for a checkpoint — and the resumed run must end with exactly the
// losses of a run that was never interrupted. The faults come from PARTRAIN_TEST_SAVE_FAULT
// (trainer/observe/test_injection.h).
#include <algorithm>
#include <set>

#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

// Three epochs, a checkpoint after each, keep 1: the second save is the one that dies, so a
// first checkpoint exists, and removing it too early (before latest.json names the second)
// would leave nothing to resume from.
const char* kSingle = "strategy: single\ntrain: {epochs: 3, threads: 1}\n";
const char* kDdp = "strategy: ddp\nlaunch: {nproc_per_node: 2}\ntrain: {epochs: 3, threads: 1}\n";

std::vector<std::string> run_args(const fs::path& cfg) {
  std::vector<std::string> args = {
      "run", cfg.string(), "--set", "checkpoint.keep=1", "--set", "checkpoint.resume=auto"};
  if (read_text(cfg).find("strategy: ddp") != std::string::npos) {
    args.insert(args.end(), {"--set", "comm.backend=asio-ring"});
  }
  return args;
}

// Runs `cfg` with PARTRAIN_TEST_SAVE_FAULT=`fault` (unset when empty); its wait status.
std::optional<int> run_with_fault(const fs::path& cfg, const fs::path& log,
                                  const std::string& fault) {
  if (fault.empty()) {
    unsetenv("PARTRAIN_TEST_SAVE_FAULT");
  } else {
    setenv("PARTRAIN_TEST_SAVE_FAULT", fault.c_str(), 1);
  }
  pid_t pid = start_partrain(run_args(cfg), log);
  unsetenv("PARTRAIN_TEST_SAVE_FAULT");
  return wait_exit(pid, std::chrono::seconds(120));
}

// The checkpoint folder's file names, each temp name cut to "FINAL.tmp" (its suffix is random).
std::set<std::string> listing(const fs::path& checkpoints) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(checkpoints)) {
    std::string name = entry.path().filename().string();
    const auto tmp = name.find(".tmp-");
    if (tmp != std::string::npos) name = name.substr(0, tmp) + ".tmp";
    names.insert(name);
  }
  return names;
}

std::uintmax_t temp_size(const fs::path& checkpoints, const std::string& final_name) {
  for (const auto& entry : fs::directory_iterator(checkpoints)) {
    if (entry.path().filename().string().rfind(final_name + ".tmp-", 0) == 0)
      return fs::file_size(entry.path());
  }
  return 0;
}

struct Expected {
  std::string phase;
  std::set<std::string> files;  // in out/checkpoints after the death
  std::string manifest_names;   // the checkpoint latest.json names then
};

const std::vector<Expected>& expectations() {
  static const std::vector<Expected> all = {
      {"before", {"best.pt", "epoch-0001.pt", "latest.json"}, "epoch-0001.pt"},
      {"write", {"best.pt", "epoch-0001.pt", "epoch-0002.pt.tmp", "latest.json"}, "epoch-0001.pt"},
      {"rename", {"best.pt", "epoch-0001.pt", "epoch-0002.pt.tmp", "latest.json"}, "epoch-0001.pt"},
      {"manifest", {"best.pt", "epoch-0001.pt", "epoch-0002.pt", "latest.json"}, "epoch-0001.pt"},
      {"prune", {"best.pt", "epoch-0001.pt", "epoch-0002.pt", "latest.json"}, "epoch-0002.pt"},
  };
  return all;
}

// What the death at `e.phase` left in `dir`: the files the phase implies, nothing more; a
// manifest that names a whole checkpoint; a temp file of the size the phase implies.
void expect_resumable_leftovers(const fs::path& dir, const Expected& e) {
  const fs::path checkpoints = dir / "out" / "checkpoints";
  ASSERT_TRUE(fs::is_directory(checkpoints));
  EXPECT_EQ(listing(checkpoints), e.files);
  const Json manifest = Json::parse(read_text(checkpoints / "latest.json"));
  ASSERT_EQ(manifest["file"].get<std::string>(), e.manifest_names) << manifest.dump();
  EXPECT_EQ(manifest["epoch"].get<int>(), e.manifest_names == "epoch-0001.pt" ? 1 : 2);
  const fs::path named = checkpoints / e.manifest_names;
  ASSERT_TRUE(fs::exists(named));
  EXPECT_EQ(fs::file_size(named), manifest["bytes"].get<std::uintmax_t>());
  // The previous checkpoint: untouched by the save that died, the size it was written with.
  ASSERT_TRUE(fs::exists(checkpoints / "epoch-0001.pt"));
  const auto previous = fs::file_size(checkpoints / "epoch-0001.pt");
  if (e.manifest_names == "epoch-0001.pt") {
    EXPECT_EQ(previous, manifest["bytes"].get<std::uintmax_t>());
  }
  // The temp file: half a checkpoint after "write", a whole one (a little longer than the
  // previous: its meta holds one more epoch) after "rename".
  const auto temp = temp_size(checkpoints, "epoch-0002.pt");
  if (e.phase == "write") {
    EXPECT_GT(temp, previous / 3);
    EXPECT_LT(temp, previous * 2 / 3);
  } else if (e.phase == "rename") {
    EXPECT_GE(temp, previous);
    EXPECT_LT(temp, previous + previous / 10);
  }
}

// Resumes `cfg` without the fault: it must start from the checkpoint latest.json named, clear
// what the death left, and end with `expected`'s losses.
void expect_resume_to_losses(const fs::path& dir, const fs::path& cfg, const Expected& e,
                             const std::vector<double>& expected) {
  const auto status = run_with_fault(cfg, dir / "resume.txt", "");
  const std::string output = read_text(dir / "resume.txt");
  ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << output;
  EXPECT_NE(
      output.find("resumed from " + (dir / "out" / "checkpoints" / e.manifest_names).string()),
      std::string::npos)
      << output;
  EXPECT_EQ(listing(dir / "out" / "checkpoints"),
            (std::set<std::string>{"best.pt", "epoch-0003.pt", "latest.json"}));
  EXPECT_EQ(epoch_losses(dir), expected);
}

// The uninterrupted run of `body` in a scratch folder `name`: its three epochs' losses.
void straight_losses(const std::string& name, const std::string& body,
                     std::vector<double>& losses) {
  auto straight = scratch(name);
  const auto status = run_with_fault(write_config(straight, body), straight / "output.txt", "");
  ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << read_text(straight / "output.txt");
  losses = epoch_losses(straight);
  ASSERT_EQ(losses.size(), 3u);
}

TEST(CheckpointSaveFault, DeathAtEveryStepOfTheSaveResumesToTheSameLosses) {
  std::vector<double> expected;
  ASSERT_NO_FATAL_FAILURE(straight_losses("save_fault_straight", kSingle, expected));

  for (const Expected& e : expectations()) {
    SCOPED_TRACE("died at " + e.phase);
    auto dir = scratch("save_fault_" + e.phase);
    const auto cfg = write_config(dir, kSingle);
    const auto died = run_with_fault(cfg, dir / "output.txt", "0:" + e.phase + ":2");
    ASSERT_TRUE(died.has_value());
    // The run is this process (one rank, no restarts): SIGKILL ends it, not an exit code.
    EXPECT_TRUE(WIFSIGNALED(*died) && WTERMSIG(*died) == SIGKILL) << read_text(dir / "output.txt");
    expect_resumable_leftovers(dir, e);
    expect_resume_to_losses(dir, cfg, e, expected);
  }
}

// Two ranks, rank 0 (the one that writes) dies between the whole temp file and its rename: the
// launcher names the signal, and the group resumes to the uninterrupted run's losses.
TEST(CheckpointSaveFault, RankZeroDyingBeforeTheRenameResumesTheGroupToTheSameLosses) {
  std::vector<double> expected;
  ASSERT_NO_FATAL_FAILURE(straight_losses("save_fault_ddp_straight", kDdp, expected));

  const Expected& e = expectations()[2];
  ASSERT_EQ(e.phase, "rename");
  auto dir = scratch("save_fault_ddp");
  const auto cfg = write_config(dir, kDdp);
  const auto died = run_with_fault(cfg, dir / "output.txt", "0:rename:2");
  const std::string output = read_text(dir / "output.txt");
  ASSERT_TRUE(died && WIFEXITED(*died)) << output;
  EXPECT_EQ(WEXITSTATUS(*died), 1) << output;
  EXPECT_NE(output.find("rank 0 was killed by signal 9 (SIGKILL)"), std::string::npos) << output;
  expect_resumable_leftovers(dir, e);
  expect_resume_to_losses(dir, cfg, e, expected);
}

}  // namespace
