// defines: Config and its sections — the one validated description of a run
// (DESIGN.md "Config"); load_config(), apply_override(), config_to_yaml().
//
// Loaded once at the edge (YAML -> Config), checked there, then trusted everywhere else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace partrain {

struct LaunchConfig {
  int nproc_per_node = 1;  // 0 in the YAML means "auto"; resolved by the launcher
  bool nproc_auto = false;
  // nproc_per_node as a list, one count per node in node-rank order ([2, 1]: machines with
  // different numbers of ranks); empty when it is one count or auto.
  std::vector<int> node_sizes;
  int nnodes = 1;
  std::string rendezvous;  // empty: a fresh store per run, made and removed by the launcher
  int max_restarts = 0;
};

struct CommConfig {
  std::string backend = "auto";  // gloo | asio-ring | nccl | auto
  double bucket_mb = 25.0;
  std::string wire_dtype = "f32";  // f32 | f16 | bf16
  double timeout_s = 300.0;
  std::string interface;  // NIC to bind and advertise; empty: the route to the master
  std::string host;       // or the address itself; empty: see interface
};

struct DataConfig {
  // cifar100 | cifar10 | fashion-mnist | mnist | image-folder | tensors | synthetic
  std::string dataset = "synthetic";
  std::string root;  // empty: the dataset's default
  bool download = false;
  std::string url;       // cifar100 archive; empty: the official one
  int batch_size = 128;  // per rank
  int num_workers = 2;
  bool augment = false;
  std::int64_t train_limit = 0;
  std::int64_t test_limit = 0;
  int image_size = 0;  // image-folder: shorter side resized to this, then centre-cropped; 0 = keep
  // Normalisation, 1 value (every channel) or one per channel; empty: the dataset's own.
  std::vector<double> mean;
  std::vector<double> std;
  // synthetic only
  std::int64_t synthetic_train = 5000;
  std::int64_t synthetic_test = 1000;
};

struct ModelConfig {
  std::string name = "digitalnet";  // digitalnet | resnet18 | mlp
  int width = 64;
  std::string norm = "batch";  // batch | none
  // A module saved from Python (torch.jit.script / trace); set, it is the model, and name,
  // width and norm must be left out.
  std::string torchscript;
  bool sync_batchnorm = false;  // strategy ddp: BatchNorm statistics reduced across ranks
};

struct OptimizerConfig {
  std::string name = "sgd";  // sgd | adamw
  double lr = 0.05;          // unset with adamw: 1e-3, PyTorch's default
  // sgd: L2 added to the gradient; adamw: decoupled. Unset with adamw: 0.01, PyTorch's.
  double weight_decay = 5.0e-4;
  double momentum = 0.9;  // sgd only
  bool nesterov = false;  // sgd only; needs momentum > 0
  double beta1 = 0.9;     // adamw only (betas: [beta1, beta2])
  double beta2 = 0.999;
  double eps = 1.0e-8;  // adamw only
};

// The learning rate at each optimizer step (see lr_schedule.h): a linear warmup over
// warmup_steps, then constant, step or cosine.
struct ScheduleConfig {
  std::string name = "constant";  // constant | step | cosine
  std::int64_t warmup_steps = 0;
  std::int64_t step_size = 0;  // step: optimizer steps between decays, counted after warmup
  double gamma = 0.1;          // step: the factor of each decay
  double min_lr = 0.0;         // cosine: the rate it reaches at the run's last step
};

struct TrainConfig {
  int epochs = 10;
  std::int64_t max_steps = 0;
  int accumulate_steps = 1;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  double label_smoothing = 0.0;   // of the training loss; test_loss stays plain cross-entropy
  double clip_grad_norm = 0.0;    // max global L2 norm of the averaged gradients; 0 = off
  std::string precision = "f32";  // f32 | bf16 | f16 (autocast; f16 with a loss scaler)
  int threads = 0;
  int log_every = 20;  // steps between metrics.jsonl step lines
};

struct CheckpointConfig {
  int every_epochs = 1;
  int keep = 3;
  std::string resume = "auto";  // auto | never | PATH
};

struct Config {
  std::string source;  // the file it was loaded from
  std::string name = "run";
  std::uint64_t seed = 0;
  std::string device = "auto";      // cuda | cpu | auto
  std::string strategy = "single";  // ddp | dp | single
  LaunchConfig launch;
  CommConfig comm;
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  CheckpointConfig checkpoint;
  std::string output_dir = "runs/run";
  std::string reference;  // optional reference file for parity
};

// Reads and validates the YAML file, then applies each "key.path=value" override in order.
// Every error is a UsageError whose message starts with "FILE:LINE:COL: " and names the key
// (overrides use "--set key.path" as their location).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The resolved config as YAML text (what `partrain validate` prints) and as JSON text
// (embedded in report.json).
std::string config_to_yaml(const Config& config);
std::string config_to_json(const Config& config);

}  // namespace partrain
