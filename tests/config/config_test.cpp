// Config loading: defaults, every kind of error with its file:line:col, --set overrides,
// and the shipped configs.
#include "trainer/config/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm_backends/algorithms/algorithm_choice.h"
#include "comm_backends/communicator.h"
#include "comm_backends/store/tcp_store.h"
#include "common/errors.h"
#include "trainer/config/config_agreement.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir(), ignored);
  }
  static fs::path dir() {
    return fs::temp_directory_path() / ("partrain_config_test_" + std::to_string(::getpid()));
  }
  std::string write(const std::string& text) {
    fs::create_directories(dir());
    fs::path path = dir() / (std::to_string(counter_++) + ".yaml");
    std::ofstream(path) << text;
    return path.string();
  }
  // The message of the UsageError that loading throws; fails the test when none is thrown.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
    std::string path = write(text);
    try {
      load_config(path, overrides);
    } catch (const UsageError& e) {
      std::string msg = e.what();
      // Every message names the file (or the override) first.
      EXPECT_TRUE(msg.rfind(path, 0) == 0 || msg.rfind("--set", 0) == 0) << msg;
      return msg.rfind(path, 0) == 0 ? msg.substr(path.size()) : msg;
    }
    ADD_FAILURE() << "no error for:\n" << text;
    return "";
  }
  int counter_ = 0;
};

TEST_F(ConfigTest, DefaultsAndValues) {
  Config c =
      load_config(write("name: x\nstrategy: ddp\nlaunch: {nproc_per_node: 3}\n"
                        "data: {batch_size: 7, dataset: cifar100}\ntrain: {epochs: 2}\n"));
  EXPECT_EQ(c.name, "x");
  EXPECT_EQ(c.strategy, StrategyKind::kDdp);
  EXPECT_EQ(c.launch.nproc_per_node, NodeLayout::every_node(3));
  EXPECT_EQ(c.data.batch_size, 7);
  EXPECT_EQ(c.data.dataset, DatasetKind::kCifar100);
  EXPECT_EQ(c.train.epochs, 2);
  EXPECT_DOUBLE_EQ(c.train.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(c.comm.bucket_mb, 25.0);
  EXPECT_EQ(c.output_dir, "runs/x");  // follows the name unless output.dir is set
}

TEST_F(ConfigTest, NprocAuto) {
  Config c = load_config(write("strategy: ddp\nlaunch: {nproc_per_node: auto}\n"));
  EXPECT_TRUE(c.launch.nproc_per_node.is_auto());
  EXPECT_NE(config_to_json(c).find("\"nproc_per_node\":\"auto\""), std::string::npos);
}

// One count per node, for machines with different numbers of ranks; each a whole count from
// 1 to 1024, and shown as the list in the resolved config.
TEST_F(ConfigTest, NprocPerNodeAsAListOfCountsPerNode) {
  Config c = load_config(write("strategy: ddp\nlaunch: {nnodes: 2, nproc_per_node: [2, 1]}\n"));
  EXPECT_EQ(c.launch.nproc_per_node, NodeLayout::per_node({2, 1}));
  EXPECT_NE(config_to_json(c).find("\"nproc_per_node\":[2,1]"), std::string::npos)
      << config_to_json(c);
  c = load_config(write("strategy: ddp\n"), {"launch.nproc_per_node=[1,3]"});
  EXPECT_EQ(c.launch.nproc_per_node, NodeLayout::per_node({1, 3}));
  EXPECT_EQ(error_of("strategy: ddp\nlaunch: {nproc_per_node: [2, 1.5]}\n"),
            ":2:30: launch.nproc_per_node: item 1: expected a whole number of ranks, got '1.5'");
  EXPECT_EQ(error_of("strategy: ddp\nlaunch: {nproc_per_node: [2, 0]}\n"),
            ":2:30: launch.nproc_per_node: item 1: 0 is out of range (0, 1024]");
  EXPECT_EQ(error_of("strategy: ddp\nlaunch: {nproc_per_node: [2, x]}\n"),
            ":2:30: launch.nproc_per_node: item 1: expected a number, got 'x'");
  EXPECT_NE(error_of("strategy: single\nlaunch: {nproc_per_node: [1, 1]}\n")
                .find("strategy single runs one process"),
            std::string::npos);
}

TEST_F(ConfigTest, ObserveTraceItsWindowAndTensorBoard) {
  Config d = load_config(write("name: x\n"));
  EXPECT_FALSE(d.observe.trace);
  EXPECT_EQ(d.observe.trace_first_step, 10);
  EXPECT_EQ(d.observe.trace_last_step, 29);
  Config c = load_config(write("observe: {trace: true, trace_steps: [0, 999]}\n"));
  EXPECT_TRUE(c.observe.trace);
  EXPECT_EQ(c.observe.trace_first_step, 0);
  EXPECT_EQ(c.observe.trace_last_step, 999);
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(c)))), config_to_json(c));
  EXPECT_EQ(load_config(write("name: x\n"), {"observe.trace=true"}).observe.trace, true);
  // TensorBoard's events are on unless turned off; the resolved config keeps the choice.
  EXPECT_TRUE(d.observe.tensorboard);
  Config off = load_config(write("observe: {tensorboard: false}\n"));
  EXPECT_FALSE(off.observe.tensorboard);
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(off)))), config_to_json(off));
  EXPECT_EQ(error_of("observe: {tensorboard: 2}\n").substr(0, 36),
            ":1:24: observe.tensorboard: expected");

  EXPECT_EQ(error_of("observe: {trace: maybe}\n").substr(0, 30), ":1:18: observe.trace: expected");
  EXPECT_EQ(error_of("observe: {trace_steps: [3, 1]}\n"),
            ":1:24: observe.trace_steps: the last step 1 is before the first 3");
  EXPECT_EQ(error_of("observe: {trace_steps: [0, 1000]}\n"),
            ":1:24: observe.trace_steps: 1001 steps; a trace holds at most 1000");
  EXPECT_EQ(error_of("observe: {trace_steps: [10]}\n"),
            ":1:24: observe.trace_steps: expected two step numbers [first, last], e.g. [10, 29]");
  EXPECT_EQ(error_of("observe: {trace_steps: [1.5, 3]}\n"),
            ":1:24: observe.trace_steps: expected whole step numbers, got 1.5");
  EXPECT_EQ(error_of("observe: {trace_steps: [-1, 3]}\n"),
            ":1:25: observe.trace_steps: item 0: -1 is out of range [0, 1.09951e+12]");
  EXPECT_EQ(error_of("observe:\n  trace_step: [1, 3]\n").substr(0, 38),
            ":2:3: observe.trace_step: unknown key ");
}

TEST_F(ConfigTest, UnknownKeyNamesLineColumnAndKey) {
  EXPECT_EQ(
      error_of("name: x\ndata:\n  batch_sise: 5\n"),
      ":3:3: data.batch_sise: unknown key (known here: augment, balance, batch_size, dataset, "
      "download, global_batch_size, image_size, mean, num_workers, root, std, "
      "synthetic_test, synthetic_train, test_limit, train_limit, url)");
  EXPECT_EQ(error_of("nmae: x\n").substr(0, 20), ":1:1: nmae: unknown ");
}

TEST_F(ConfigTest, WrongTypes) {
  EXPECT_EQ(error_of("train:\n  epochs: ten\n"),
            ":2:11: train.epochs: expected an integer, got 'ten'");
  EXPECT_EQ(error_of("data: {augment: maybe}\n"),
            ":1:17: data.augment: expected true or false, got 'maybe'");
  EXPECT_EQ(error_of("train: {optimizer: {lr: [1, 2]}}\n"),
            ":1:25: train.optimizer.lr: expected a number, got 'a collection'");
  EXPECT_EQ(error_of("data: 5\n"), ":1:7: data: expected a mapping of keys");
}

TEST_F(ConfigTest, OutOfRange) {
  EXPECT_EQ(error_of("data: {batch_size: 0}\n"),
            ":1:20: data.batch_size: 0 is out of range [1, 1048576]");
  EXPECT_EQ(error_of("data: {batch_size: -5}\n"),
            ":1:20: data.batch_size: -5 is out of range [1, 1048576]");
  // Larger than any integer type: a clear error, not an overflow.
  EXPECT_EQ(error_of("train: {epochs: 99999999999999999999999}\n"),
            ":1:17: train.epochs: expected an integer, got '99999999999999999999999'");
  EXPECT_EQ(error_of("train: {optimizer: {momentum: 1.5}}\n"),
            ":1:31: train.optimizer.momentum: 1.5 is out of range [0, 1]");
}

TEST_F(ConfigTest, DuplicateKey) {
  EXPECT_EQ(error_of("model: {width: 8}\nseed: 1\nmodel: {width: 16}\n"),
            ":3:1: model: duplicate key (first set at line 1)");
  EXPECT_EQ(error_of("data: {batch_size: 1, batch_size: 2}\n"),
            ":1:23: data.batch_size: duplicate key (first set at line 1)");
}

TEST_F(ConfigTest, BadEnumValue) {
  EXPECT_EQ(error_of("comm: {backend: mpi}\n"),
            ":1:17: comm.backend: 'mpi' is not one of nccl | shm | hierarchical | asio-ring | gloo "
            "| auto");
  EXPECT_EQ(error_of("device: tpu\n"), ":1:9: device: 'tpu' is not one of cuda | cpu | auto");
  EXPECT_EQ(error_of("strategy: fsdp\n"),
            ":1:11: strategy: 'fsdp' is not one of ddp | dp | single");
  EXPECT_EQ(error_of("model: {name: vit}\n"),
            ":1:15: model.name: 'vit' is not one of digitalnet | resnet18 | mlp");
  EXPECT_EQ(error_of("model: {norm: layer}\n"),
            ":1:15: model.norm: 'layer' is not one of batch | none");
  EXPECT_EQ(error_of("comm: {wire_dtype: f64}\n"),
            ":1:20: comm.wire_dtype: 'f64' is not one of f32 | f16 | bf16");
  EXPECT_EQ(error_of("comm: {algorithm: bcube}\n"),
            ":1:19: comm.algorithm: 'bcube' is not one of auto | ring | recursive_doubling | "
            "rabenseifner");
  EXPECT_EQ(error_of("comm: {tcp_congestion: Cubic}\n"),
            ":1:24: comm.tcp_congestion: 'Cubic' is not auto, system or the name of a TCP "
            "congestion control (cubic, reno, bbr, ...)");
  EXPECT_EQ(load_config(write("name: x\n"), {"comm.tcp_congestion=system"}).comm.tcp_congestion,
            "system");
  EXPECT_EQ(error_of("comm: {shm_single_copy: sometimes}\n"),
            ":1:25: comm.shm_single_copy: expected true or false, got 'sometimes'");
  EXPECT_TRUE(load_config(write("name: x\n")).comm.shm_single_copy);
  EXPECT_FALSE(
      load_config(write("name: x\n"), {"comm.shm_single_copy=false"}).comm.shm_single_copy);
  EXPECT_EQ(error_of("data: {dataset: imagenet}\n"),
            ":1:17: data.dataset: 'imagenet' is not one of cifar100 | cifar10 | fashion-mnist | "
            "mnist | image-folder | tensors | synthetic");
  EXPECT_EQ(error_of("device: [cuda]\n"), ":1:9: device: expected a string");
  EXPECT_EQ(error_of("device: ''\n"), ":1:9: device: '' is not one of cuda | cpu | auto");
}

// comm.backend stays a string: comm_backends' list of backends owns the names. The config
// accepts every one of them and lists no other in its error.
TEST_F(ConfigTest, BackendNamesAreCommBackendsOwn) {
  const std::vector<std::string> names = comm::backend_names();
  for (const std::string& name : names) {
    EXPECT_EQ(load_config(write("name: x\n"), {"comm.backend=" + name}).comm.backend, name);
  }
  // comm.algorithm likewise: the algorithm families are comm_backends'.
  for (const std::string& name : comm::algorithm_request_names()) {
    EXPECT_EQ(load_config(write("name: x\n"), {"comm.algorithm=" + name}).comm.algorithm, name);
  }
  const std::string error = error_of("comm: {backend: mpi}\n");
  EXPECT_EQ(static_cast<std::size_t>(std::count(error.begin(), error.end(), '|')) + 1, names.size())
      << error;
}

// Each name of each enum's table reads as its enumerator and prints back as itself, so the
// tables, the reader and the writers agree. A name missing from a table, or one that reads as
// another enumerator, fails here.
TEST_F(ConfigTest, EveryEnumNameReadsBackAsItself) {
  auto check = [&](auto table, const std::string& key, auto field) {
    const std::string leaf = key.substr(key.find_last_of('.') + 1);  // npos + 1 = 0: all of it
    for (const auto& entry : table) {
      std::vector<std::string> overrides = {detail::concat(key, "=", entry.name)};
      if (entry.name == "step") overrides.push_back("train.schedule.step_size=1");
      if (entry.name == "powersgd") overrides.push_back("strategy=ddp");
      if (key == "train.shard") overrides.push_back("strategy=ddp");
      const Config c = load_config(write("name: x\n"), overrides);
      EXPECT_EQ(field(c), entry.value) << key << " " << entry.name;
      EXPECT_EQ(name_of(entry.value), entry.name);
      const std::string json = config_to_json(c);
      EXPECT_NE(json.find(detail::concat("\"", leaf, "\":\"", entry.name, "\"")), std::string::npos)
          << json;
    }
  };
  check(names_of(DeviceChoice{}), "device", [](const Config& c) { return c.device; });
  check(names_of(StrategyKind{}), "strategy", [](const Config& c) { return c.strategy; });
  check(names_of(Precision{}), "train.precision",
        [](const Config& c) { return c.train.precision; });
  check(names_of(DatasetKind{}), "data.dataset", [](const Config& c) { return c.data.dataset; });
  check(names_of(ModelName{}), "model.name", [](const Config& c) { return c.model.name; });
  check(names_of(Norm{}), "model.norm", [](const Config& c) { return c.model.norm; });
  check(names_of(OptimizerName{}), "train.optimizer.name",
        [](const Config& c) { return c.train.optimizer.name; });
  check(names_of(ScheduleName{}), "train.schedule.name",
        [](const Config& c) { return c.train.schedule.name; });
  check(names_of(Compression{}), "comm.compression",
        [](const Config& c) { return c.comm.compression; });
  check(names_of(Shard{}), "train.shard", [](const Config& c) { return c.train.shard; });
  check(names_of(CpuBinding{}), "launch.bind", [](const Config& c) { return c.launch.bind; });
}

// train.shard: none by default; optimizer and gradients only with strategy ddp and without
// PowerSGD, each refusal at the key's place saying why.
TEST_F(ConfigTest, Shard) {
  EXPECT_EQ(load_config(write("name: x\n")).train.shard, Shard::kNone);
  EXPECT_EQ(load_config(write("strategy: ddp\ntrain: {shard: gradients}\n")).train.shard,
            Shard::kGradients);
  EXPECT_EQ(error_of("strategy: dp\ntrain: {shard: optimizer}\n"),
            ":2:16: train.shard: shards the optimizer state over the ranks of strategy ddp; "
            "strategy dp has one process holding everything (use shard: none)");
  EXPECT_EQ(error_of("strategy: ddp\ncomm: {compression: powersgd}\ntrain: {shard: optimizer}\n"),
            ":3:16: train.shard: cannot be combined with comm.compression powersgd: PowerSGD's "
            "compressed gradients are rebuilt whole on every rank, so no rank can keep only its "
            "slice (use shard: none, or compression: none)");
  EXPECT_NE(error_of("strategy: ddp\ntrain: {shard: zero3}\n").find("train.shard"),
            std::string::npos);
}

TEST_F(ConfigTest, Compression) {
  Config c = load_config(write("name: x\n"));
  EXPECT_EQ(c.comm.compression, Compression::kNone);
  EXPECT_NE(config_to_json(c).find("\"powersgd_rank\":null"), std::string::npos);
  c = load_config(write("strategy: ddp\ncomm: {compression: powersgd}\n"));
  EXPECT_EQ(c.comm.compression, Compression::kPowerSgd);
  EXPECT_EQ(c.comm.powersgd_rank, 2);
  EXPECT_EQ(c.comm.powersgd_start_step, 10);
  c = load_config(
      write("strategy: ddp\n"
            "comm: {compression: powersgd, powersgd_rank: 4, powersgd_start_step: 0}\n"));
  EXPECT_EQ(c.comm.powersgd_rank, 4);
  EXPECT_EQ(c.comm.powersgd_start_step, 0);
  const std::string json = config_to_json(c);
  EXPECT_NE(json.find("\"compression\":\"powersgd\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"powersgd_rank\":4"), std::string::npos) << json;
  // The resolved config loads back as the same config, with compression and without.
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(c)))), json);
  const Config plain = load_config(write("name: x\n"));
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(plain)))), config_to_json(plain));

  EXPECT_EQ(error_of("strategy: ddp\ncomm: {compression: topk}\n"),
            ":2:21: comm.compression: 'topk' is not one of none | powersgd");
  EXPECT_EQ(error_of("strategy: ddp\ncomm: {compression: powersgd, powersgd_rank: 0}\n"),
            ":2:46: comm.powersgd_rank: 0 is out of range [1, 1024]");
  EXPECT_EQ(error_of("strategy: ddp\ncomm: {compression: powersgd, powersgd_rank: 1.5}\n"),
            ":2:46: comm.powersgd_rank: expected an integer, got '1.5'");
  EXPECT_EQ(error_of("strategy: ddp\ncomm: {compression: powersgd, powersgd_start_step: -1}\n"),
            ":2:52: comm.powersgd_start_step: -1 is out of range [0, 1099511627776]");
  EXPECT_EQ(error_of("strategy: ddp\ncomm: {powersgd_rank: 4}\n"),
            ":2:23: comm.powersgd_rank: applies to comm.compression powersgd only");
  EXPECT_EQ(error_of("comm: {compression: powersgd}\n"),
            ":1:21: comm.compression: powersgd compresses the gradient allreduce of strategy "
            "ddp; strategy single has none (use compression: none)");
  EXPECT_EQ(error_of("strategy: ddp\ndevice: cuda\ncomm: {compression: powersgd}\n"
                     "train: {precision: f16}\n"),
            ":4:20: train.precision: f16 (loss scaling) cannot be combined with comm.compression "
            "powersgd (use precision bf16 or f32)");
  EXPECT_EQ(error_of("strategy: ddp\n", {"comm.compression=powersgd", "comm.powersgd_rank=0"}),
            "--set comm.powersgd_rank=0: comm.powersgd_rank: 0 is out of range [1, 1024]");
}

TEST_F(ConfigTest, WireDtypeAndResume) {
  const std::string checkpoint = write("a checkpoint, as far as the config can tell");
  Config c =
      load_config(write("comm: {wire_dtype: bf16}\ncheckpoint: {resume: " + checkpoint + "}\n"));
  EXPECT_EQ(c.comm.wire_dtype, comm::DType::bf16);
  EXPECT_EQ(c.comm.algorithm, "auto");
  EXPECT_EQ(c.checkpoint.resume.mode, ResumeMode::kPath);
  EXPECT_EQ(c.checkpoint.resume.path, checkpoint);
  EXPECT_NE(config_to_json(c).find("\"wire_dtype\":\"bf16\""), std::string::npos);
  // The path is printed as it is (and reads back as the same path: JSON escapes a Windows
  // path's backslashes, so it is compared after the round trip).
  const Config again = load_config(write(config_to_yaml(c)));
  EXPECT_EQ(again.checkpoint.resume.mode, ResumeMode::kPath);
  EXPECT_EQ(again.checkpoint.resume.path, checkpoint);
  EXPECT_EQ(config_to_json(again), config_to_json(c));
  c = load_config(write("checkpoint: {resume: never}\n"));
  EXPECT_EQ(c.checkpoint.resume.mode, ResumeMode::kNever);
  EXPECT_NE(config_to_json(c).find("\"resume\":\"never\""), std::string::npos);
  c = load_config(write("name: x\n"));
  EXPECT_EQ(c.comm.wire_dtype, comm::DType::f32);
  EXPECT_EQ(c.checkpoint.resume.mode, ResumeMode::kAuto);
  EXPECT_NE(config_to_json(c).find("\"resume\":\"auto\""), std::string::npos);
  EXPECT_EQ(error_of("checkpoint: {resume: /nonexistent/c.pt}\n"),
            ": checkpoint.resume: '/nonexistent/c.pt' is neither auto, never nor an existing "
            "checkpoint file");
  EXPECT_EQ(error_of("checkpoint: {resume: ''}\n"),
            ": checkpoint.resume: '' is neither auto, never nor an existing checkpoint file");
}

TEST_F(ConfigTest, RendezvousMustBeAStoreUrl) {
  EXPECT_EQ(error_of("launch:\n  rendezvous: ftp://nowhere\n"),
            ":2:15: launch.rendezvous: store url 'ftp://nowhere': unknown scheme 'ftp' (expected "
            "file, tcp or env)");
  EXPECT_NE(error_of("launch: {rendezvous: 'tcp://node01'}\n").find("expected HOST:PORT"),
            std::string::npos);
  EXPECT_NE(error_of("launch: {rendezvous: 'tcp://node01:70000'}\n").find("expected HOST:PORT"),
            std::string::npos);
  EXPECT_NE(error_of("launch: {rendezvous: 'env://x'}\n").find("takes nothing after it"),
            std::string::npos);
  EXPECT_NE(error_of("launch: {rendezvous: /tmp/x}\n").find("expected file://DIR"),
            std::string::npos);
  // Accepted: what open_store() serves. env:// needs MASTER_* only where the workers start.
  for (const char* url : {"file:///tmp/rdzv", "tcp://node01:29500", "tcp://[fd00::1]:29500",
                          "tcp://10.0.0.1:29500", "env://"}) {
    EXPECT_EQ(
        load_config(write(std::string("launch: {rendezvous: '") + url + "'}\n")).launch.rendezvous,
        url);
  }
}

TEST_F(ConfigTest, InterfaceAndHost) {
  const Config c = load_config(write("comm: {interface: ens5, host: 'fd00::5'}\n"));
  EXPECT_EQ(c.comm.interface, "ens5");
  EXPECT_EQ(c.comm.host, "fd00::5");
  EXPECT_EQ(error_of("comm: {interface: 'eth 0'}\n"),
            ":1:19: comm.interface: 'eth 0' is not a network interface name (e.g. eth0, ens5, "
            "ib0)");
  EXPECT_EQ(error_of("comm: {host: 'http://x'}\n"),
            ":1:14: comm.host: 'http://x' is not a host name or IP address");
}

TEST_F(ConfigTest, NotYaml) {
  std::string msg = error_of("name: [unclosed\n");
  EXPECT_NE(msg.find("not valid YAML"), std::string::npos) << msg;
  EXPECT_EQ(msg.substr(0, 1), ":");
  EXPECT_EQ(error_of("- a\n- b\n"), ":1:1: expected a mapping of config keys at the top level");
}

TEST_F(ConfigTest, MissingFiles) {
  EXPECT_THROW(load_config("/nonexistent/partrain.yaml"), UsageError);
  EXPECT_EQ(error_of("reference: /nonexistent/ref.yaml\n"),
            ":1:12: reference: file '/nonexistent/ref.yaml' does not exist (paths are relative "
            "to the working directory)");
}

TEST_F(ConfigTest, OverridesApplyAndNameThemselvesInErrors) {
  std::string path = write("data: {batch_size: 8}\n");
  Config c =
      load_config(path, {"data.batch_size=32", "train.optimizer.lr=0.1", "comm.backend=gloo"});
  EXPECT_EQ(c.data.batch_size, 32);
  EXPECT_DOUBLE_EQ(c.train.optimizer.lr, 0.1);
  EXPECT_EQ(c.comm.backend, "gloo");
  EXPECT_EQ(error_of("data: {batch_size: 8}\n", {"data.batch_size=0"}),
            "--set data.batch_size=0: data.batch_size: 0 is out of range [1, 1048576]");
  EXPECT_EQ(error_of("{}\n", {"data.nope=1"}).substr(0, 29), "--set data.nope=1: data.nope:");
  EXPECT_THROW(load_config(path, {"novalue"}), UsageError);
}

TEST_F(ConfigTest, DatasetKeysImageSizeMeanAndStd) {
  Config c =
      load_config(write("data:\n  dataset: image-folder\n  image_size: 64\n"
                        "  mean: [0.5, 0.4, 0.3]\n  std: 0.25\n"));
  EXPECT_EQ(c.data.dataset, DatasetKind::kImageFolder);
  EXPECT_EQ(c.data.image_size, 64);
  EXPECT_EQ(c.data.mean, (std::vector<double>{0.5, 0.4, 0.3}));
  EXPECT_EQ(c.data.std, (std::vector<double>{0.25}));
  for (const DatasetKind kind :
       {DatasetKind::kCifar10, DatasetKind::kMnist, DatasetKind::kTensors}) {
    const std::string text = "data: {dataset: " + std::string(name_of(kind)) + "}\n";
    EXPECT_EQ(load_config(write(text)).data.dataset, kind);
  }
  // The YAML form carries the lists and reads back the same.
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(c)))), config_to_json(c));
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(Config{})))), config_to_json(Config{}));

  EXPECT_EQ(error_of("data: {dataset: imagenet}\n").substr(0, 40),
            ":1:17: data.dataset: 'imagenet' is not o");
  EXPECT_EQ(error_of("data: {dataset: image-folder, image_size: -1}\n"),
            ":1:43: data.image_size: -1 is out of range [0, 4096]");
  EXPECT_EQ(error_of("data: {dataset: cifar10, image_size: 32}\n"),
            ":1:38: data.image_size: resizing applies to data.dataset image-folder only, not "
            "cifar10 (set it to 0 or remove it)");
  EXPECT_EQ(error_of("data:\n  std: [0.2, 0, 0.2]\n"),
            ":2:14: data.std: item 1: 0 is out of range (0, 100]");
  EXPECT_EQ(error_of("data:\n  mean: [0.5, x]\n"),
            ":2:15: data.mean: item 1: expected a number, got 'x'");
  EXPECT_EQ(error_of("data:\n  mean: []\n"), ":2:9: data.mean: expected 1 to 64 numbers, got 0");
  EXPECT_EQ(error_of("data:\n  mean: {r: 1}\n"),
            ":2:9: data.mean: expected a number or a list of numbers");
  EXPECT_EQ(error_of("data:\n  dataset: mnist\n  mean: [0.1, 0.2, 0.3]\n"),
            ":3:9: data.mean: 3 values, but mnist images have 1 channel (give 1)");
  EXPECT_EQ(error_of("data: {dataset: cifar10, std: [0.2, 0.2]}\n"),
            ":1:31: data.std: 2 values, but cifar10 images have 3 channels (give 1 or 3)");
  EXPECT_EQ(error_of("data: {dataset: mnist}\n", {"data.mean=[1, 2]"}),
            "--set data.mean=[1, 2]: data.mean: 2 values, but mnist images have 1 channel (give "
            "1)");
}

TEST_F(ConfigTest, RecipeKeys) {
  Config c =
      load_config(write("train:\n  optimizer: {name: adamw, betas: [0.8, 0.99], eps: 1.0e-6}\n"
                        "  schedule: {name: cosine, warmup_steps: 10, min_lr: 1.0e-5}\n"
                        "  label_smoothing: 0.1\n  clip_grad_norm: 2.5\n  precision: bf16\n"));
  EXPECT_EQ(c.train.optimizer.name, OptimizerName::kAdamW);
  EXPECT_DOUBLE_EQ(c.train.optimizer.lr, 1e-3);  // PyTorch's AdamW defaults
  EXPECT_DOUBLE_EQ(c.train.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.train.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.train.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.train.optimizer.eps, 1e-6);
  EXPECT_EQ(c.train.schedule.name, ScheduleName::kCosine);
  EXPECT_EQ(c.train.schedule.warmup_steps, 10);
  EXPECT_DOUBLE_EQ(c.train.schedule.min_lr, 1e-5);
  EXPECT_DOUBLE_EQ(c.train.label_smoothing, 0.1);
  EXPECT_DOUBLE_EQ(c.train.clip_grad_norm, 2.5);
  EXPECT_EQ(c.train.precision, Precision::kBf16);
  // An adamw line that also says nesterov: false, as a config may.
  Config a = load_config(
      write("train:\n  optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.05, nesterov: false}\n"
            "  schedule: {name: cosine, warmup_steps: 100, min_lr: 0.0}\n"));
  EXPECT_DOUBLE_EQ(a.train.optimizer.weight_decay, 0.05);
  EXPECT_DOUBLE_EQ(a.train.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(a.train.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(a.train.optimizer.eps, 1e-8);

  Config d =
      load_config(write("train: {optimizer: {nesterov: true}, "
                        "schedule: {name: step, step_size: 100, gamma: 0.5}}\n"));
  EXPECT_EQ(d.train.optimizer.name, OptimizerName::kSgd);
  EXPECT_TRUE(d.train.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(d.train.optimizer.lr, 0.05);
  EXPECT_EQ(d.train.schedule.step_size, 100);
  EXPECT_DOUBLE_EQ(d.train.schedule.gamma, 0.5);
  Config e = load_config(write("name: x\n"));
  EXPECT_EQ(e.train.schedule.name, ScheduleName::kConstant);
  EXPECT_EQ(e.train.precision, Precision::kF32);
  EXPECT_DOUBLE_EQ(e.train.clip_grad_norm, 0.0);
  // Round trip through the resolved YAML keeps every recipe key.
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(c)))), config_to_json(c));
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(d)))), config_to_json(d));
}

TEST_F(ConfigTest, RecipeErrorsNameTheKeyAndPlace) {
  EXPECT_EQ(error_of("train: {optimizer: {name: adam}}\n"),
            ":1:27: train.optimizer.name: 'adam' is not one of sgd | adamw");
  EXPECT_EQ(error_of("train: {optimizer: {name: adamw, momentum: 0.9}}\n"),
            ":1:44: train.optimizer.momentum: applies to optimizer sgd only (adamw has betas)");
  EXPECT_EQ(error_of("train: {optimizer: {name: adamw, nesterov: true}}\n"),
            ":1:44: train.optimizer.nesterov: applies to optimizer sgd only");
  EXPECT_EQ(error_of("train: {optimizer: {eps: 1.0e-8}}\n"),
            ":1:26: train.optimizer.eps: applies to optimizer adamw only, not sgd");
  EXPECT_EQ(error_of("train: {optimizer: {momentum: 0, nesterov: true}}\n"),
            ":1:44: train.optimizer.nesterov: Nesterov momentum needs momentum > 0");
  EXPECT_EQ(error_of("train: {optimizer: {name: adamw, betas: [0.9]}}\n"),
            ":1:41: train.optimizer.betas: expected two numbers [beta1, beta2]");
  EXPECT_EQ(error_of("train: {optimizer: {name: adamw, betas: [0.9, 1.5]}}\n"),
            ":1:47: train.optimizer.betas: item 1: 1.5 is out of range [0, 0.999999]");
  EXPECT_EQ(error_of("train: {schedule: {name: linear}}\n"),
            ":1:26: train.schedule.name: 'linear' is not one of constant | step | cosine");
  EXPECT_EQ(error_of("train: {schedule: {name: step}}\n"),
            ":1:26: train.schedule.step_size: schedule step needs step_size (optimizer steps "
            "between decays)");
  EXPECT_EQ(error_of("train: {schedule: {name: step, step_size: 0}}\n"),
            ":1:43: train.schedule.step_size: 0 is out of range [1, 1099511627776]");
  EXPECT_EQ(error_of("train: {schedule: {name: cosine, gamma: 0.5}}\n"),
            ":1:41: train.schedule.gamma: applies to schedule step only, not cosine");
  EXPECT_EQ(error_of("train: {schedule: {min_lr: 0.1}}\n"),
            ":1:28: train.schedule.min_lr: applies to schedule cosine only, not constant");
  EXPECT_EQ(error_of("train: {optimizer: {lr: 0.1}, schedule: {name: cosine, min_lr: 0.5}}\n"),
            ":1:64: train.schedule.min_lr: min_lr 0.5 is above the optimizer's lr 0.1");
  EXPECT_EQ(error_of("train: {schedule: {warmup_steps: -1}}\n"),
            ":1:34: train.schedule.warmup_steps: -1 is out of range [0, 1099511627776]");
  EXPECT_EQ(error_of("train: {label_smoothing: 1.5}\n"),
            ":1:26: train.label_smoothing: 1.5 is out of range [0, 1]");
  EXPECT_EQ(error_of("train: {clip_grad_norm: -1}\n"),
            ":1:25: train.clip_grad_norm: -1 is out of range [0, 1000000000]");
  EXPECT_EQ(error_of("train: {precision: fp16}\n"),
            ":1:20: train.precision: 'fp16' is not one of f32 | bf16 | f16");
  EXPECT_EQ(error_of("device: cpu\ntrain: {precision: f16}\n"),
            ":2:20: train.precision: f16 needs device cuda: autocast on the CPU computes in bf16 "
            "only (use precision bf16 or f32)");
  EXPECT_EQ(error_of("name: x\n", {"train.schedule.name=cosine", "train.schedule.gamma=0.5"}),
            "--set train.schedule.gamma=0.5: train.schedule.gamma: applies to schedule step only, "
            "not cosine");
}

TEST_F(ConfigTest, YamlAndJsonRoundTrip) {
  Config c = load_config(write("name: rt\nseed: 7\ndata: {batch_size: 9}\n"));
  std::string yaml = config_to_yaml(c);
  Config again = load_config(write(yaml));
  EXPECT_EQ(again.seed, 7u);
  EXPECT_EQ(again.data.batch_size, 9);
  EXPECT_EQ(config_to_json(again), config_to_json(c));
}

TEST_F(ConfigTest, GlobalBatchSizeIsSharedOverTheRanks) {
  const std::string path = write("strategy: ddp\ndata: {global_batch_size: 96}\n");
  Config c = load_config(path);
  EXPECT_EQ(c.data.global_batch_size, 96);
  EXPECT_EQ(c.data.batch_size, 0);  // unresolved until the world size is known
  EXPECT_EQ(c.data.global_batch_size_at, path + ":2:27");
  EXPECT_EQ(micro_batch_size(c), 96);
  // Unresolved, it loads again as it is (batch_size null).
  EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(c)))), config_to_json(c));
  Config three = c;
  resolve_batch_size(three, 3);
  EXPECT_EQ(three.data.batch_size, 32);
  resolve_batch_size(three, 4);  // again, from the global batch
  EXPECT_EQ(three.data.batch_size, 24);
  // The resolved config shows the rank's share beside the global batch.
  EXPECT_NE(config_to_json(three).find("\"batch_size\":24,\"global_batch_size\":96"),
            std::string::npos)
      << config_to_json(three);
  // Accumulated: each micro-step holds 96 / 4 = 24 samples over all ranks.
  Config accumulated =
      load_config(write("data: {global_batch_size: 96}\n"), {"train.accumulate_steps=4"});
  EXPECT_EQ(micro_batch_size(accumulated), 24);
  resolve_batch_size(accumulated, 2);
  EXPECT_EQ(accumulated.data.batch_size, 12);
  // Per-rank mode: resolving changes nothing.
  Config per_rank = load_config(write("data: {batch_size: 10}\n"));
  resolve_batch_size(per_rank, 4);
  EXPECT_EQ(per_rank.data.batch_size, 10);
  EXPECT_EQ(micro_batch_size(per_rank), 0);
}

TEST_F(ConfigTest, GlobalBatchSizeThatCannotBeSplitIsRefused) {
  EXPECT_EQ(error_of("data:\n  batch_size: 8\n  global_batch_size: 64\n"),
            ":3:22: data.global_batch_size: given with data.batch_size: 64 samples per step over "
            "all ranks, or 8 per rank; give one of the two");
  EXPECT_EQ(error_of("data: {global_batch_size: 64}\n", {"data.batch_size=8"}),
            ":1:27: data.global_batch_size: given with data.batch_size: 64 samples per step over "
            "all ranks, or 8 per rank; give one of the two");
  EXPECT_EQ(error_of("data: {global_batch_size: 0}\n"),
            ":1:27: data.global_batch_size: 0 is out of range [1, 1099511627776]");
  EXPECT_EQ(error_of("data: {global_batch_size: 100}\ntrain: {accumulate_steps: 3}\n"),
            ":1:27: data.global_batch_size: 100 samples do not split into 3 equal micro-steps "
            "(train.accumulate_steps 3); use a multiple of it");
  // The world size is known only at launch: the error points at the key all the same.
  const std::string path = write("strategy: ddp\ndata:\n  global_batch_size: 100\n");
  Config c = load_config(path);
  try {
    resolve_batch_size(c, 3);
    ADD_FAILURE() << "100 samples split over 3 ranks";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              path +
                  ":3:22: data.global_batch_size: 100 samples per step do not split evenly "
                  "over 3 ranks; use a multiple of 3");
  }
  Config accumulated = load_config(path, {"train.accumulate_steps=2"});
  try {
    resolve_batch_size(accumulated, 4);
    ADD_FAILURE() << "50 samples split over 4 ranks";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              path +
                  ":3:22: data.global_batch_size: 50 samples per micro-step (100 / 2 "
                  "accumulate_steps) do not split evenly over 4 ranks; use a multiple of 8");
  }
  Config overridden = load_config(path, {"data.global_batch_size=10"});
  EXPECT_THROW(resolve_batch_size(overridden, 4), UsageError);
  try {
    resolve_batch_size(overridden, 4);
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--set data.global_batch_size=10: ", 0), 0u) << e.what();
  }
}

TEST_F(ConfigTest, BalanceSplitsTheMicroBatchByWeights) {
  const std::string path =
      write("strategy: ddp\ndata:\n  global_batch_size: 64\n  balance: [3, 1]\n");
  Config c = load_config(path);
  EXPECT_EQ(c.data.balance, BalanceMode::kWeights);
  EXPECT_EQ(c.data.balance_weights, (std::vector<double>{3, 1}));
  EXPECT_EQ(c.data.balance_at, path + ":4:12");
  Config rank1 = c;
  resolve_batch_size(rank1, 2, 1);
  EXPECT_EQ(rank1.data.shares, (std::vector<std::int64_t>{48, 16}));
  EXPECT_EQ(rank1.data.batch_size, 16);
  resolve_batch_size(c, 2, 0);
  EXPECT_EQ(c.data.batch_size, 48);
  // Written back as the list; it loads again to the same config.
  EXPECT_NE(config_to_json(c).find("\"balance\":[3.0,1.0]"), std::string::npos)
      << config_to_json(c);
  // Accumulated: the weights split each micro-step (100 / 4 = 25 by 2:3 is 10 and 15).
  Config accumulated = load_config(
      path, {"data.global_batch_size=100", "data.balance=[2, 3]", "train.accumulate_steps=4"});
  resolve_batch_size(accumulated, 2, 1);
  EXPECT_EQ(accumulated.data.shares, (std::vector<std::int64_t>{10, 15}));
  // auto starts even, by largest remainder where W does not divide M; even is the default.
  Config automatic = load_config(path, {"data.balance=auto", "data.global_batch_size=10"});
  EXPECT_EQ(automatic.data.balance, BalanceMode::kAuto);
  resolve_batch_size(automatic, 3, 2);
  EXPECT_EQ(automatic.data.shares, (std::vector<std::int64_t>{4, 3, 3}));
  EXPECT_EQ(automatic.data.batch_size, 3);
  EXPECT_NE(config_to_json(automatic).find("\"balance\":\"auto\""), std::string::npos);
  Config even = load_config(write("data: {global_batch_size: 64}\n"));
  EXPECT_EQ(even.data.balance, BalanceMode::kEven);
  resolve_batch_size(even, 4, 3);
  EXPECT_EQ(even.data.shares, (std::vector<std::int64_t>(4, 16)));
  // Unresolved (a resolved one names both batch keys), auto and weights load again.
  for (const char* balance : {"data.balance=auto", "data.balance=[0.5, 2]"}) {
    const Config written = load_config(path, {balance});
    EXPECT_EQ(config_to_json(load_config(write(config_to_yaml(written)))), config_to_json(written));
  }
}

TEST_F(ConfigTest, BalanceThatDoesNotFitIsRefusedNamingTheKeyAndNumbers) {
  EXPECT_EQ(error_of("data: {batch_size: 8, balance: auto}\n"),
            ":1:32: data.balance: needs data.global_batch_size (the samples per step that the "
            "ranks share); with a per-rank data.batch_size every rank takes the same");
  EXPECT_EQ(error_of("data: {global_batch_size: 64, balance: [3, 0]}\n"),
            ":1:44: data.balance: rank 1's weight is 0; every weight must be > 0");
  EXPECT_EQ(error_of("data: {global_batch_size: 64, balance: [-2, 1]}\n"),
            ":1:41: data.balance: rank 0's weight is -2; every weight must be > 0");
  EXPECT_EQ(error_of("data: {global_batch_size: 64, balance: fast}\n"),
            ":1:40: data.balance: 'fast' is not one of even | auto | a list of weights, one "
            "per rank");
  EXPECT_EQ(error_of("data: {global_batch_size: 64, balance: weights}\n"),
            ":1:40: data.balance: 'weights' is not one of even | auto | a list of weights, one "
            "per rank");
  // SyncBatchNorm weighs each rank by its samples (trainer/parallel/sync_batchnorm.cpp).
  EXPECT_TRUE(load_config(write("strategy: ddp\ndata: {global_batch_size: 64, balance: auto}\n"
                                "model: {sync_batchnorm: true}\n"))
                  .model.sync_batchnorm);
  // The world size is known at launch: the count of weights and the rounding are checked then.
  const std::string path = write("data:\n  global_batch_size: 8\n  balance: [100, 1]\n");
  Config c = load_config(path);
  auto resolve_error = [](Config config, int world) {
    try {
      resolve_batch_size(config, world);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(resolve_error(c, 3),
            path + ":3:12: data.balance: 2 weights for 3 ranks; give one per rank");
  EXPECT_EQ(resolve_error(c, 1),
            path + ":3:12: data.balance: 2 weights for 1 rank; give one per rank");
  EXPECT_EQ(resolve_error(c, 2),
            path +
                ":3:12: data.balance: rank 1's share of 8 samples per micro-step rounds to 0 "
                "(weights 100,1); every rank needs at least 1 sample");
  EXPECT_EQ(resolve_error(load_config(path, {"data.balance=auto"}), 9),
            path +
                ":2:22: data.global_batch_size: 8 samples per step cannot give each of 9 ranks "
                "a sample");
}

TEST_F(ConfigTest, TorchScriptModelStandsAlone) {
  const std::string model = write("a TorchScript file, as far as the config can tell");
  Config c = load_config(write("model: {torchscript: " + model + "}\n"));
  EXPECT_EQ(c.model.torchscript, model);
  EXPECT_FALSE(c.model.sync_batchnorm);
  // The built-in model's keys would be ignored: an error at the key, not silence.
  EXPECT_EQ(error_of("model:\n  torchscript: " + model + "\n  width: 32\n"),
            ":3:10: model.width: has no effect with model.torchscript (the saved module is the "
            "model); remove one of the two");
  EXPECT_EQ(error_of("model: {name: digitalnet, torchscript: " + model + "}\n").substr(0, 18),
            ":1:15: model.name:");
  EXPECT_EQ(error_of("model: {}\n", {"model.torchscript=/nonexistent/m.pt"}),
            "--set model.torchscript=/nonexistent/m.pt: model.torchscript: file "
            "'/nonexistent/m.pt' does not exist (paths are relative to the working directory)");
  // The resolved config leaves the built-in keys out (null), so it loads again as it is.
  const std::string yaml = config_to_yaml(c);
  EXPECT_NE(yaml.find("name: ~"), std::string::npos) << yaml;
  EXPECT_EQ(config_to_json(load_config(write(yaml))), config_to_json(c));
}

TEST_F(ConfigTest, SyncBatchNormNeedsRanksAndBatchNormLayers) {
  Config c = load_config(write("strategy: ddp\nmodel: {sync_batchnorm: true}\n"));
  EXPECT_TRUE(c.model.sync_batchnorm);
  EXPECT_TRUE(load_config(write("model: {sync_batchnorm: true}\n")).model.sync_batchnorm);
  EXPECT_EQ(error_of("model: {sync_batchnorm: yes please}\n"),
            ":1:25: model.sync_batchnorm: expected true or false, got 'yes please'");
  const std::string prefix = ":2:43: model.sync_batchnorm: ";
  auto why = [&](const std::string& text) {
    std::string msg = error_of(text);
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
    return msg.substr(std::min(msg.size(), prefix.size()));
  };
  EXPECT_EQ(why("strategy: dp\nmodel: {name: digitalnet, sync_batchnorm: true}\n").substr(0, 20),
            "needs strategy ddp (");
  EXPECT_EQ(why("strategy: ddp\nmodel: {name: mlp,        sync_batchnorm: true}\n"),
            "model mlp has no BatchNorm layers to synchronise");
  EXPECT_EQ(why("strategy: ddp\nmodel: {norm: none,       sync_batchnorm: true}\n"),
            "model digitalnet with norm: none has no BatchNorm layers to synchronise");
  EXPECT_TRUE(load_config(write("strategy: ddp\nmodel: {name: resnet18, sync_batchnorm: true}\n"))
                  .model.sync_batchnorm);
  const std::string model = write("model");
  EXPECT_NE(error_of("strategy: ddp\nmodel: {sync_batchnorm: true, torchscript: " + model + "}\n")
                .find("model.sync_batchnorm: not available with model.torchscript"),
            std::string::npos);
}

TEST(ShippedConfigs, AllValidate) {
  const char* root = PARTRAIN_SOURCE_DIR;
  fs::current_path(root);  // configs name their reference files relative to the repo
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(root) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    EXPECT_NO_THROW(load_config(entry.path().string())) << entry.path();
    ++seen;
  }
  EXPECT_GE(seen, 4);
  // The examples' config names the model file its README's first command saves.
  const fs::path model =
      fs::temp_directory_path() / ("partrain_example_" + std::to_string(::getpid()) + ".pt");
  std::ofstream(model) << "model";
  EXPECT_NO_THROW(
      load_config((fs::path(root) / "examples" / "torchscript_fashion_mnist.yaml").string(),
                  {"model.torchscript=" + model.string()}));
  fs::remove(model);
}

// A node that could not start its ranks (Note [A node that could not start] in
// cli/run_command.cpp) tells rank 0's store server why, without the run token it could not
// derive; rank 0 ends the config check with that line, and every rank that came stops with it
// (exit 2) long before its timeout, while the ranks of that node never come.
TEST_F(ConfigTest, RanksStopWithTheLineOfANodeThatCouldNotStart) {
  const std::string agreement = agreement_json(load_config(write("strategy: ddp\n")));
  comm::StoreOptions options;
  options.token = "run";
  options.timeout = std::chrono::seconds(20);
  options.world_size = 3;
  options.host_server = true;
  comm::TcpStore host("127.0.0.1", 0, options);
  options.host_server = false;
  options.rank = 1;
  comm::TcpStore client("127.0.0.1", host.port(), options);
  const std::string line = "node 1 (h9) could not start its ranks: a.yaml: cannot open config file";
  const auto start = std::chrono::steady_clock::now();
  std::string said[2];
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      try {
        agree_on_config(rank == 0 ? static_cast<comm::Store&>(host) : client, agreement, rank, 3,
                        std::chrono::seconds(20));
      } catch (const UsageError& e) {
        said[rank] = e.what();
      } catch (const std::exception& e) {
        said[rank] = std::string("not a usage error: ") + e.what();
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both wait for rank 2
  EXPECT_TRUE(comm::tell_tcp_store("127.0.0.1", host.port(), line, std::chrono::seconds(5)));
  for (auto& rank : ranks) rank.join();
  EXPECT_EQ(said[0], line);
  EXPECT_EQ(said[1], line);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// What ranks must agree on: keys a host may set its own way leave the agreement text alone; any
// other key is named with both ranks' values, three at most and then how many more; in
// global-batch mode each rank's own share of the batch may differ; a TorchScript model counts
// by its bytes and checkpoint.resume by its kind, not their paths.
TEST_F(ConfigTest, RanksAgreeOnEveryKeyButTheHostsOwn) {
  const std::string body = "strategy: ddp\ntrain: {optimizer: {name: sgd, lr: 0.05}}\n";
  const std::string base = agreement_json(load_config(write(body)));
  EXPECT_EQ(agreement_json(load_config(
                write(body),
                {"data.root=/elsewhere", "train.threads=3", "data.num_workers=4",
                 "comm.interface=eth1", "comm.timeout_s=90", "output.dir=/o", "launch.bind=none"})),
            base);
  EXPECT_NE(agreement_json(load_config(write(body), {"launch.max_restarts=2"})), base);
  fs::create_directories(dir() / "a");
  fs::create_directories(dir() / "b");
  std::ofstream(dir() / "a" / "e.pt") << "checkpoint";
  std::ofstream(dir() / "b" / "e.pt") << "checkpoint";
  auto resuming = [&](const fs::path& from) {
    return agreement_json(load_config(write(body), {"checkpoint.resume=" + from.string()}));
  };
  const std::string at_a = resuming(dir() / "a" / "e.pt");
  EXPECT_EQ(resuming(dir() / "b" / "e.pt"), at_a);
  EXPECT_EQ(config_differences(agreement_json(load_config(write(body), {"checkpoint.resume=auto"})),
                               1, at_a, 0),
            "checkpoint.resume is \"auto\" on rank 1 and \"a path\" on rank 0");
  std::ofstream(dir() / "m1.pt") << "model bytes";
  std::ofstream(dir() / "m2.pt") << "model bytes";
  std::ofstream(dir() / "m3.pt") << "other bytes";
  auto with_model = [&](const char* name) {
    Config c = load_config(write(body));
    c.model.torchscript = (dir() / name).string();  // as model.torchscript names it, unread here
    return agreement_json(c);
  };
  EXPECT_EQ(with_model("m1.pt"), with_model("m2.pt"));
  EXPECT_NE(with_model("m1.pt"), with_model("m3.pt"));
  const std::string lr = agreement_json(load_config(write(body), {"train.optimizer.lr=0.1"}));
  EXPECT_EQ(config_differences(lr, 2, base, 0),
            "train.optimizer.lr is 0.1 on rank 2 and 0.05 on rank 0");
  EXPECT_EQ(config_differences(base, 0, base, 0), "");
  const std::string many =
      agreement_json(load_config(write(body), {"train.optimizer.lr=0.1", "seed=7", "model.width=4",
                                               "comm.backend=shm", "train.epochs=9"}));
  const std::string named = config_differences(many, 1, base, 0);
  EXPECT_EQ(named.rfind("comm.backend is \"shm\" on rank 1 and \"auto\" on rank 0; model.width "
                        "is 4 on rank 1 and ",
                        0),
            0u)
      << named;
  EXPECT_NE(named.find(" (and 2 more)"), std::string::npos) << named;
  EXPECT_EQ(config_differences("not json", 1, base, 0),
            "its config cannot be compared key by key with rank 0's");

  Config share =
      load_config(write("strategy: ddp\ndata: {global_batch_size: 10, balance: auto}\n"));
  resolve_batch_size(share, 3, 0);
  const std::int64_t first_share = share.data.batch_size;
  const std::string first = agreement_json(share);
  resolve_batch_size(share, 3, 2);
  EXPECT_NE(share.data.batch_size, first_share);  // 4 and 3 of the 10
  EXPECT_EQ(agreement_json(share), first);
}

}  // namespace
}  // namespace partrain
