// Whole runs with model.torchscript, the way a user runs them: DigitalNet saved from Python
// by examples/save_digitalnet.py (Debian's python3-torch; the tests skip without it), trained
// by the built executable, its checkpoint loaded back into the Python module with strict=True.
// Also DDP against one process for scripted and traced modules over each CPU backend, resume,
// each kind of bad module refused with exit 2 and one line, and model.sync_batchnorm's runs
// against one process with plain BatchNorm.
#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

const std::string kPython = "/usr/bin/python3";

bool have_python_torch() {
  static const bool ok =
      std::system(("timeout 120 " + kPython + " -c 'import torch' > /dev/null 2>&1").c_str()) == 0;
  return ok;
}

#define SKIP_WITHOUT_PYTHON_TORCH()                                                        \
  if (!have_python_torch()) {                                                              \
    GTEST_SKIP() << "no Python torch at " << kPython << " (Debian's python3-torch, which " \
                 << "scripts/setup.sh installs)";                                          \
  }

// Runs a Python command line (the examples' scripts take paths relative to the source tree).
Result python(const std::string& args, const fs::path& dir) {
  const fs::path log = dir / "python.txt";
  const std::string cmd = "cd " + std::string(PARTRAIN_SOURCE_DIR) + " && timeout 300 " + kPython +
                          " " + args + " > " + log.string() + " 2>&1";
  const int status = std::system(cmd.c_str());
  return Result{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

// DigitalNet for the synthetic data set of write_config (3 x 32 x 32, 100 classes).
fs::path save_digitalnet(const fs::path& dir, const std::string& name, const std::string& flags) {
  const fs::path out = dir / (name + ".pt");
  Result r = python("examples/save_digitalnet.py --out " + out.string() +
                        " --in-channels 3 --num-classes 100 --width 8 " + flags,
                    dir);
  EXPECT_EQ(r.code, 0) << r.output;
  return out;
}

std::string with_model(const fs::path& model) {
  // write_config's base names a built-in model; these keys replace it.
  return " --set model.name=null --set model.width=null --set model.norm=null --set "
         "model.torchscript=" +
         model.string();
}

// 2 ranks at batch 16 against 1 process at batch 32: without BatchNorm the same losses, up to
// float rounding (as for the built-in models in run_test.cpp).
void expect_ddp_matches_single(const std::string& name, const std::string& save_flags,
                               const std::string& backend) {
  auto single = scratch("ts_single_" + name), ddp = scratch("ts_ddp_" + name);
  const fs::path model = save_digitalnet(single, name, "--norm none " + save_flags);
  const std::string body = "train: {epochs: 2, threads: 1}\n";
  Result r1 = partrain("run " + write_config(single, "strategy: single\n" + body).string() +
                           with_model(model) + " --set data.batch_size=32",
                       single);
  ASSERT_EQ(r1.code, 0) << r1.output;
  Result r2 = partrain(
      "run " + write_config(ddp, "strategy: ddp\nlaunch: {nproc_per_node: 2}\n" + body).string() +
          with_model(model) + " --set data.batch_size=16 --set comm.backend=" + backend,
      ddp);
  ASSERT_EQ(r2.code, 0) << r2.output;
  const auto l1 = epoch_losses(single), l2 = epoch_losses(ddp);
  ASSERT_EQ(l1.size(), 2u);
  ASSERT_EQ(l2.size(), 2u);
  for (size_t i = 0; i < l1.size(); ++i) {
    EXPECT_NEAR(l1[i], l2[i], 1e-4 * std::abs(l1[i])) << "epoch " << i + 1;
  }
  EXPECT_LT(l1[1], l1[0]);  // and it learns
  EXPECT_NEAR(read_report(single)["final"]["test_accuracy"].get<double>(),
              read_report(ddp)["final"]["test_accuracy"].get<double>(), 0.006);
}

TEST(TorchScriptRun, ScriptedDdpAsioRingMatchesSingleProcess) {
  SKIP_WITHOUT_PYTHON_TORCH();
  expect_ddp_matches_single("scripted_ring", "", "asio-ring");
}

TEST(TorchScriptRun, ScriptedDdpGlooMatchesSingleProcess) {
  SKIP_WITHOUT_PYTHON_TORCH();
  expect_ddp_matches_single("scripted_gloo", "", "gloo");
}

TEST(TorchScriptRun, TracedDdpShmMatchesSingleProcess) {
  SKIP_WITHOUT_PYTHON_TORCH();
  expect_ddp_matches_single("traced_shm", "--trace", "shm");
}

TEST(TorchScriptRun, CheckpointLoadsIntoThePythonModuleStrictly) {
  SKIP_WITHOUT_PYTHON_TORCH();
  auto dir = scratch("ts_python_round_trip");
  const fs::path initial = dir / "initial.pt";
  const fs::path model = save_digitalnet(dir, "digitalnet", "--state-dict " + initial.string());
  auto cfg = write_config(dir,
                          "strategy: ddp\nlaunch: {nproc_per_node: 2}\n"
                          "train: {epochs: 1, max_steps: 3, threads: 1}\n");
  Result r = partrain("run " + cfg.string() + with_model(model), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  // Strict, every dtype and shape as the module's own (int64 num_batches_tracked), every
  // parameter moved from its initial value, and BatchNorm counted the 3 steps.
  Result loaded = python(
      "examples/load_checkpoint.py " + (dir / "out" / "checkpoints" / "epoch-0001.pt").string() +
          " --in-channels 3 --num-classes 100 --width 8 --initial " + initial.string(),
      dir);
  EXPECT_EQ(loaded.code, 0) << loaded.output;
  EXPECT_NE(loaded.output.find("loaded 26 tensors into DigitalNet, strict; "
                               "bn1.num_batches_tracked = 3"),
            std::string::npos)
      << loaded.output;
}

TEST(TorchScriptRun, ResumeContinuesExactlyWhereItStopped) {
  SKIP_WITHOUT_PYTHON_TORCH();
  auto straight = scratch("ts_straight"), resumed = scratch("ts_resumed");
  const fs::path model = save_digitalnet(straight, "digitalnet", "");
  const std::string body = "strategy: single\ntrain: {epochs: 2, threads: 1}\n";
  ASSERT_EQ(
      partrain("run " + write_config(straight, body).string() + with_model(model), straight).code,
      0);
  auto cfg = write_config(resumed, body);
  ASSERT_EQ(
      partrain("run " + cfg.string() + with_model(model) + " --set train.epochs=1", resumed).code,
      0);
  Result r = partrain("run " + cfg.string() + with_model(model) + " --set checkpoint.resume=auto",
                      resumed);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(epoch_losses(straight), epoch_losses(resumed));
}

std::vector<std::string> nonempty_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

TEST(TorchScriptRun, BadModulesExitTwoWithOneLineSayingWhy) {
  SKIP_WITHOUT_PYTHON_TORCH();
  auto dir = scratch("ts_bad");
  // Modules that are wrong for the synthetic data (3 x 32 x 32 images, 100 classes).
  const fs::path script = dir / "bad_models.py";
  std::ofstream(script) << R"(import sys, torch
from torch import nn
sys.path.insert(0, "examples")
from digitalnet import DigitalNet
out = sys.argv[1]
class NoParameters(nn.Module):
    def forward(self, x):
        return torch.zeros(x.size(0), 100)
class Features(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
    def forward(self, x):
        return self.conv(x)
class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = DigitalNet(3, 100, 4)
    def forward(self, x):
        y = self.net(x)
        return y, y
torch.jit.script(NoParameters()).save(out + "/no_parameters.pt")
torch.jit.script(Features()).save(out + "/rank.pt")
torch.jit.script(DigitalNet(3, 10, 4)).save(out + "/classes.pt")
torch.jit.script(Pair()).save(out + "/pair.pt")
torch.jit.script(DigitalNet(1, 100, 4)).save(out + "/throws.pt")
torch.save(DigitalNet(3, 100, 4).state_dict(), out + "/state_dict.pt")
)";
  Result made = python(script.string() + " " + dir.string(), dir);
  ASSERT_EQ(made.code, 0) << made.output;
  auto cfg = write_config(dir, "strategy: single\ntrain: {epochs: 1, threads: 1}\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"state_dict", "not a TorchScript file"},
      {"no_parameters", "has no parameters"},
      {"rank", "to [3, 4, 30, 30]; expected logits [3, 100]"},
      {"classes", "to [3, 10]; expected logits [3, 100]"},
      {"pair", "returns Tuple"},
      {"throws", "forward fails on a batch [3, 3, 32, 32]: RuntimeError: "},
  };
  for (const auto& [name, why] : cases) {
    SCOPED_TRACE(name);
    const fs::path model = dir / (name + ".pt");
    Result r = partrain("run " + cfg.string() + with_model(model), dir);
    EXPECT_EQ(r.code, 2) << r.output;
    const auto lines = nonempty_lines(r.output);
    ASSERT_EQ(lines.size(), 1u) << r.output;
    EXPECT_NE(lines[0].find(model.string() + ": "), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(why), std::string::npos) << lines[0];
  }
  // A file that is not there is caught with the config, at the key.
  Result r = partrain("run " + cfg.string() + with_model(dir / "missing.pt"), dir);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("model.torchscript: file '" + (dir / "missing.pt").string() +
                          "' does not exist"),
            std::string::npos)
      << r.output;
}

// SyncBatchNorm: 2 ranks at batch 16 follow one process at batch 32 with plain BatchNorm;
// plain BatchNorm over 2 ranks does not (each normalises its half with its own statistics).
TEST(SyncBatchNormRun, TwoRanksMatchOneProcessWithTwiceTheBatch) {
  auto single = scratch("sbn_single"), synced = scratch("sbn_synced"), plain = scratch("sbn_plain");
  const std::string body = "train: {epochs: 1, max_steps: 10, threads: 1}\n";
  Result r1 = partrain("run " + write_config(single, "strategy: single\n" + body).string() +
                           " --set data.batch_size=32",
                       single);
  ASSERT_EQ(r1.code, 0) << r1.output;
  const std::string ddp = "strategy: ddp\nlaunch: {nproc_per_node: 2}\n" + body;
  Result r2 = partrain("run " + write_config(synced, ddp).string() +
                           " --set data.batch_size=16 --set model.sync_batchnorm=true "
                           "--set comm.backend=asio-ring",
                       synced);
  ASSERT_EQ(r2.code, 0) << r2.output;
  Result r3 = partrain("run " + write_config(plain, ddp).string() +
                           " --set data.batch_size=16 --set comm.backend=asio-ring",
                       plain);
  ASSERT_EQ(r3.code, 0) << r3.output;
  const double l1 = epoch_losses(single).at(0), l2 = epoch_losses(synced).at(0),
               l3 = epoch_losses(plain).at(0);
  const double t1 = read_report(single)["final"]["test_loss"].get<double>(),
               t2 = read_report(synced)["final"]["test_loss"].get<double>(),
               t3 = read_report(plain)["final"]["test_loss"].get<double>();
  std::printf("train loss: single %.9g, synced %.9g, plain %.9g\n", l1, l2, l3);
  std::printf("test loss:  single %.9g, synced %.9g, plain %.9g\n", t1, t2, t3);
  EXPECT_NEAR(l2, l1, 5e-5 * l1);
  EXPECT_GT(std::abs(l3 - l1), 1e-3 * l1) << "plain BatchNorm over 2 ranks matched too";
  // The test loss, computed with the running statistics, is more sensitive to the last bits
  // of the parameters (early in training, the running statistics are far from a batch's);
  // still it agrees several times more closely than plain BatchNorm's.
  EXPECT_NEAR(t2, t1, 5e-4 * t1);
  EXPECT_GT(std::abs(t3 - t1), 1e-3 * t1);
  EXPECT_GT(std::abs(t3 - t1), 3 * std::abs(t2 - t1));
}

}  // namespace
