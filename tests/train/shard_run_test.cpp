// train.shard on whole runs of the built executable: optimizer and gradients train as unsharded
// DDP does and hold less; their checkpoints are one shard per rank beside the checkpoint, which
// resumes at another world size, sharded or not, as the uninterrupted run; `partrain export`
// gathers the shards into one file that Python's torch.load reads, with safetensors beside it.
#include "tests/train/run_harness.h"

namespace {

using namespace partrain_test;

// 10 steps of 48 samples an epoch, split over the ranks (global-batch mode, so a checkpoint
// resumes at another world size); AdamW; no BatchNorm (its statistics depend on the split).
const char* kShardBody =
    "strategy: ddp\ntrain: {epochs: 2, threads: 1, log_every: 5, optimizer: {name: adamw}}\n";

std::string shard_args(const fs::path& cfg, int ranks, const std::string& shard) {
  std::string args = "run " + cfg.string() + " --nproc-per-node " + std::to_string(ranks);
  for (const std::string& set :
       std::vector<std::string>{"data.batch_size=null", "data.global_batch_size=48",
                                "data.synthetic_train=480", "data.synthetic_test=128",
                                "model.norm=none", "comm.bucket_mb=0.01", "train.shard=" + shard}) {
    args += " --set " + set;
  }
  return args;
}

std::vector<double> losses_of(const fs::path& dir) {
  std::vector<double> out = epoch_losses(dir);
  out.push_back(read_report(dir)["final"]["test_loss"].get<double>());
  return out;
}

void expect_same_losses(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(b[i])) << i;
}

double memory_of(const Json& report, int rank, const char* part) {
  return report["ranks"][rank]["memory"][part].get<double>();
}

TEST(ShardRun, ShardsTrainAsUnshardedDdpHoldLessAndExportForPython) {
  auto none = scratch("shard_none"), opt = scratch("shard_optimizer"),
       grads = scratch("shard_gradients");
  Result r = partrain(shard_args(write_config(none, kShardBody), 2, "none"), none);
  ASSERT_EQ(r.code, 0) << r.output;
  r = partrain(shard_args(write_config(opt, kShardBody), 2, "optimizer"), opt);
  ASSERT_EQ(r.code, 0) << r.output;
  r = partrain(shard_args(write_config(grads, kShardBody), 2, "gradients"), grads);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto expected = losses_of(none);
  expect_same_losses(losses_of(opt), expected);
  expect_same_losses(losses_of(grads), expected);

  // Every rank's memory is accounted for; sharding halves the optimizer state (up to the
  // padding of the buckets), and gradients also keeps half the gradients and the buckets only
  // while they are on the wire.
  const Json rn = read_report(none), ro = read_report(opt), rg = read_report(grads);
  for (const Json* report : {&rn, &ro, &rg}) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE((*report)["ranks"][rank].contains("memory")) << report->dump();
      EXPECT_GT(memory_of(*report, rank, "floor_mb"), 10.0);
      EXPECT_GT(memory_of(*report, rank, "parameters_mb"), 0.0);
      EXPECT_GT(memory_of(*report, rank, "activations_mb"), 0.0);
    }
  }
  const double state = memory_of(rn, 0, "optimizer_state_mb");
  EXPECT_NEAR(memory_of(rn, 0, "optimizer_state_mb"), 2 * memory_of(rn, 0, "parameters_mb"),
              0.01 * state);  // AdamW: two moments
  EXPECT_NEAR(memory_of(ro, 0, "optimizer_state_mb"), state / 2, 0.02 * state);
  EXPECT_NEAR(memory_of(ro, 1, "optimizer_state_mb"), state / 2, 0.02 * state);
  EXPECT_NEAR(memory_of(rg, 0, "optimizer_state_mb"), state / 2, 0.02 * state);
  EXPECT_NEAR(memory_of(rn, 0, "gradients_mb"), memory_of(rn, 0, "parameters_mb"), 0.01 * state);
  // Sharded gradients: half of them, and the buckets between backward and the wire, at most
  // the one on the wire and the gradient computed meanwhile: here the two largest parameters,
  // conv4.weight (64 x 32 x 3 x 3) and fc.weight (100 x 64), which are most of the model.
  const double two_largest_mb = (64 * 32 * 9 + 100 * 64) * 4 / (1024.0 * 1024.0);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_LE(memory_of(rg, rank, "gradients_mb"),
              memory_of(rn, rank, "gradients_mb") / 2 + two_largest_mb + 1e-3);
  }

  // Each rank wrote its own shard; the checkpoint itself holds no optimizer state.
  const fs::path ckpt = grads / "out" / "checkpoints";
  EXPECT_TRUE(fs::exists(ckpt / "epoch-0002.pt.shard-00000-of-00002"));
  EXPECT_TRUE(fs::exists(ckpt / "epoch-0002.pt.shard-00001-of-00002"));
  EXPECT_TRUE(fs::exists(ckpt / "best.pt.shard-00001-of-00002"));
  EXPECT_LT(fs::file_size(ckpt / "epoch-0002.pt"),
            fs::file_size(none / "out" / "checkpoints" / "epoch-0002.pt") / 2);

  // One file from the shards, which Python reads as the unsharded run's checkpoint.
  const fs::path out = grads / "consolidated.pt", tensors = grads / "model.safetensors";
  r = partrain("export " + (ckpt / "epoch-0002.pt").string() + " --out " + out.string() +
                   " --safetensors " + tensors.string(),
               grads);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("gathered from 2 shards"), std::string::npos) << r.output;
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no Python torch (Debian's python3-torch) to read the export with";
  }
  const fs::path script = grads / "check.py";
  std::ofstream(script)
      << "import json, struct, sys, torch\n"
         "cons, plain = torch.load(sys.argv[1]), torch.load(sys.argv[2])\n"
         "m, pm = cons['model'], plain['model']\n"
         "assert cons['format'] == 'partrain.checkpoint/1' and set(m) == set(pm)\n"
         "for k in m:\n"
         "    assert torch.allclose(m[k].double(), pm[k].double(), atol=1e-5), k\n"
         "o, po = cons['optimizer'], plain['optimizer']\n"
         "assert o['name'] == po['name'] == 'adamw' and set(o['state']) == set(po['state'])\n"
         "for k, s in o['state'].items():\n"
         "    assert s['step'] == po['state'][k]['step'] == 20, (k, s['step'])\n"
         "    for key in ('exp_avg', 'exp_avg_sq'):\n"
         "        a, b = s[key], po['state'][k][key]\n"
         "        assert a.shape == b.shape == m[k].shape, (k, key)\n"
         "        assert torch.allclose(a, b, rtol=1e-3, atol=1e-8), (k, key, (a - "
         "b).abs().max())\n"
         "with open(sys.argv[3], 'rb') as f:\n"
         "    data = f.read()\n"
         "n = struct.unpack('<Q', data[:8])[0]\n"
         "header, body = json.loads(data[8:8 + n]), data[8 + n:]\n"
         "types = {'F32': torch.float32, 'I64': torch.int64}\n"
         "for k, t in m.items():\n"
         "    h = header[k]\n"
         "    b, e = h['data_offsets']\n"
         "    x = torch.frombuffer(bytearray(body[b:e]), dtype=types[h['dtype']])\n"
         "    assert torch.equal(x.reshape(h['shape']), t), k\n"
         "print('consistent', len(m), len(o['state']))\n";
  const std::string cmd = "/usr/bin/python3 " + script.string() + " " + out.string() + " " +
                          (none / "out" / "checkpoints" / "epoch-0002.pt").string() + " " +
                          tensors.string() + " > " + (grads / "python.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << read_text(grads / "python.txt");
  EXPECT_NE(read_text(grads / "python.txt").find("consistent 10 10"), std::string::npos)
      << read_text(grads / "python.txt");

  // The checkpoint re-saved from Python with an entry of another type (a shard count that is
  // not one, a meta that is a number, a model entry that is not a tensor), with a tensor whose
  // storage offset was rewritten in data.pkl to reach past its storage, or a shard re-saved
  // with a block that lacks its parameters' names (LibTorch's reader refuses that shard whole,
  // and the shard is named): resuming from it and
  // exporting it stop with one line naming the file and what is wrong (exit 2), not an internal
  // error, and a negative shard count does not resume without the optimizer's state.
  const fs::path damage = grads / "damage.py";
  std::ofstream(damage) << "import sys, torch\n"
                           "c = torch.load(sys.argv[1])\n"
                           "what = sys.argv[3]\n"
                           "if what == 'shards': c['optimizer']['shards'] = -2\n"
                           "if what == 'meta': c['meta'] = 7\n"
                           "if what == 'model': c['model']['fc.weight'] = 'weights'\n"
                           "if what == 'outrun':\n"
                           "    b = c['model']['fc.bias']\n"
                           "    base = torch.zeros(233 + b.numel(), dtype=b.dtype)\n"
                           "    base[233:] = b\n"
                           "    c['model']['fc.bias'] = base[233:]\n"
                           "torch.save(c, sys.argv[2])\n"
                           "if what == 'outrun':\n"
                           "    import zipfile\n"
                           "    src = zipfile.ZipFile(sys.argv[2])\n"
                           "    records = [(i, src.read(i.filename)) for i in src.infolist()]\n"
                           "    src.close()\n"
                           "    out = zipfile.ZipFile(sys.argv[2], 'w', zipfile.ZIP_STORED)\n"
                           "    for info, data in records:\n"
                           "        if info.filename.endswith('data.pkl'):\n"
                           "            assert data.count(b'K\\xe9') == 1\n"
                           "            data = data.replace(b'K\\xe9', b'M\\x00\\x10')\n"
                           "        out.writestr(info, data)\n"
                           "    out.close()\n"
                           "if what == 'shard':\n"
                           "    s = torch.load(sys.argv[2] + '.shard-00000-of-00002')\n"
                           "    del s['blocks'][0]['names']\n"
                           "    torch.save(s, sys.argv[2] + '.shard-00000-of-00002')\n";
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"shards", ": its optimizer state's shard count is -2, not a whole number of 1 or more"},
      {"meta", ": its meta entry holds Int where partrain writes text"},
      {"model", " cannot be loaded: "},
      {"outrun",
       " cannot be loaded: model/fc.bias of shape [100] reaches past the data the file "
       "holds for it"},
      {"shard", ".shard-00000-of-00002 cannot be read"}};
  for (const auto& [what, says] : damages) {
    const fs::path bad = ckpt / ("bad-" + what + ".pt");
    for (int s = 0; s < 2; ++s) {  // the shards beside it, as the file name finds them
      fs::copy_file(ckpt / ("epoch-0002.pt.shard-0000" + std::to_string(s) + "-of-00002"),
                    fs::path(bad.string() + ".shard-0000" + std::to_string(s) + "-of-00002"),
                    fs::copy_options::overwrite_existing);
    }
    const std::string save = "/usr/bin/python3 " + damage.string() + " " +
                             (ckpt / "epoch-0002.pt").string() + " " + bad.string() + " " + what;
    ASSERT_EQ(std::system(save.c_str()), 0) << what;
    for (const std::string& command :
         {"export " + bad.string() + " --out " + (grads / "x.pt").string(),
          shard_args(grads / "config.yaml", 2, "gradients") + " --set checkpoint.resume=" +
              bad.string() + " --set output.dir=" + (grads / ("resumed-" + what)).string()}) {
      r = partrain(command, grads);
      EXPECT_EQ(r.code, 2) << command << ": " << r.output;
      EXPECT_NE(r.output.find("checkpoint " + bad.string() + says), std::string::npos)
          << command << ": " << r.output;
      EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
    }
  }
}

// A checkpoint of 2 sharded ranks, resumed by 3 ranks sharding the other way (one of them
// sent the checkpoint by rank 0) and by 1 unsharded rank: both end as the uninterrupted run
// does.
TEST(ShardRun, TwoShardsResumeAtThreeRanksShardedAndAtOneUnsharded) {
  auto straight = scratch("shard_straight");
  Result r = partrain(shard_args(write_config(straight, kShardBody), 2, "gradients"), straight);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto expected = losses_of(straight);

  auto first = scratch("shard_first");
  r = partrain(
      shard_args(write_config(first, kShardBody), 2, "gradients") + " --set train.epochs=1", first);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string from = (first / "out" / "checkpoints" / "epoch-0001.pt").string();
  for (const auto& [ranks, shard] :
       std::vector<std::pair<int, std::string>>{{3, "optimizer"}, {1, "none"}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks, train.shard " + shard);
    auto dir = scratch("shard_resumed_" + std::to_string(ranks));
    // At 3 ranks the last one resumes as if on a host of its own: rank 0 sends it the
    // checkpoint's bytes, while the others read the file themselves.
    if (ranks == 3) ::setenv("PARTRAIN_TEST_OWN_DISK", "2:1", 1);
    r = partrain(shard_args(write_config(dir, kShardBody), ranks, shard) +
                     " --set checkpoint.resume=" + from,
                 dir);
    ::unsetenv("PARTRAIN_TEST_OWN_DISK");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("written by 2 ranks, now " + std::to_string(ranks)), std::string::npos)
        << r.output;
    expect_same_losses(losses_of(dir), expected);
  }
}

}  // namespace
