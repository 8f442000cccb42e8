// defines: Config and its sections — the one validated description of a run
// (docs/architecture.md, "Config keys"); load_config(), config_to_yaml(),
// config_to_json().
//
// Loaded once at the edge (YAML -> Config), checked there, then trusted everywhere else. Each
// field's comment gives the values the reader accepts; a value outside them is a UsageError
// naming FILE:LINE:COL and the key. Closed sets of names are enums (config_enums.h), parsed
// by the reader and printed back with name_of().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm_backends/buffer.h"
#include "trainer/config/config_enums.h"
#include "trainer/config/node_layout.h"

namespace partrain {

struct LaunchConfig {
  // Ranks on each node: one count (1..1024) for every node; auto, one rank per GPU with
  // strategy ddp (1 otherwise); or one count per node in node-rank order ([2, 1], each
  // 1..1024) for machines with different numbers of ranks. strategy single needs 1 or auto.
  NodeLayout nproc_per_node;
  int nnodes = 1;  // 1..65536 machines, each running `partrain run` with its --node-rank
  // The store the ranks meet at: file://DIR, tcp://HOST:PORT or env:// (MASTER_ADDR and
  // MASTER_PORT from the workers' environment). Empty: the launcher's choice — a fresh file
  // store per start on one node, tcp://MASTER_ADDR:MASTER_PORT (hosted by rank 0) on several.
  std::string rendezvous;
  int max_restarts = 0;  // 0..1000 restarts of the whole group after a rank fails
  // auto: on Linux each rank `partrain run` starts on a host gets cores of its own where they
  // train on the CPU, sharing CPUs evenly where the ranks outnumber the CPUs the launcher may
  // run on (Note [Binding ranks to cores] in comm_backends/placement.cpp); none: the scheduler
  // places them.
  CpuBinding bind = CpuBinding::kAuto;
};

struct CommConfig {
  // gloo | asio-ring | shm | hierarchical | nccl | auto (the names of comm_backends'
  // backend list; auto: see communicator.h).
  std::string backend = "auto";
  double bucket_mb = 25.0;  // 0.001..4096 MiB of gradients per allreduce bucket (ddp)
  // f32 | f16 | bf16: the element type asio-ring, shm and hierarchical (across hosts) send.
  comm::DType wire_dtype = comm::DType::f32;
  // auto | ring | recursive_doubling | rabenseifner: how asio-ring (and hierarchical between
  // hosts) carries each collective; auto chooses per call by size and world
  // (comm_backends/algorithms/algorithm_choice.h).
  std::string algorithm = "auto";
  // auto | system | a congestion control the kernel has (cubic, reno, bbr): what asio-ring and
  // hierarchical (across hosts) set on each TCP connection; auto takes cubic (else reno) where
  // both ends run on one machine (namespaces and containers of one kernel included) and the
  // system's between machines (comm_backends/net/timed_io.cpp).
  std::string tcp_congestion = "auto";
  // shm and hierarchical (inside a host): on Linux, where the system lets the ranks read one
  // another's memory, a large allgather copies each rank's block once, straight from its
  // process (comm_backends/shm/shm_collectives.cpp); false keeps it in shared memory.
  bool shm_single_copy = true;
  double timeout_s = 300.0;  // 0.1..604800 s: a collective or rendezvous waiting longer fails
  // NIC to bind and advertise (no spaces, '/' or ':'); empty: the one routing to the master.
  std::string interface;
  std::string host;  // or the host name or IP address itself; empty: see interface
  // none | powersgd: DDP's gradient allreduce sends low-rank factors of each weight matrix
  // instead of the matrix (PowerSGD, with error feedback; see parallel/powersgd.h). Needs
  // strategy ddp; not with train.precision f16.
  Compression compression = Compression::kNone;
  // powersgd only. 1..1024: the rank of the factors; higher sends more and approximates better.
  int powersgd_rank = 2;
  // powersgd only. 0..2^40 optimizer steps of plain allreduce before compressing: the first
  // steps' gradients change fast, and the factors start from those of the steps before.
  std::int64_t powersgd_start_step = 10;

  // timeout_s as the bound every wait is given.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
  }
};

struct DataConfig {
  DatasetKind dataset = DatasetKind::kSynthetic;
  std::string root;       // empty: the dataset's default (data::default_root())
  bool download = false;  // cifar100: fetch the archive when the files are missing
  std::string url;        // cifar100 archive; empty: the official one
  // 1..1048576 samples per rank and micro-step (per-rank mode). With global_batch_size it is
  // not given but derived: 0 until resolve_batch_size() sets it to this rank's share.
  int batch_size = 128;
  // 0: per-rank mode (batch_size). 1..2^40: samples per optimizer step over all ranks, the same
  // training whatever the world size (trainer/data/batch_plan.h); excludes batch_size.
  std::int64_t global_batch_size = 0;
  // Where global_batch_size was set (FILE:LINE:COL or its --set override): the errors that
  // need the world size (resolve_batch_size()) point there. Not a key.
  std::string global_batch_size_at;
  // Global-batch mode only: how each micro-step's M samples are split over the ranks. even: M / W
  // each; weights: in proportion to balance_weights (one > 0 per rank, rounded so that the
  // shares sum to M); auto: even at first, then in proportion to each rank's measured speed
  // (trainer/data/balance.h).
  BalanceMode balance = BalanceMode::kEven;
  std::vector<double> balance_weights;
  std::string balance_at;  // where data.balance was set, for resolve_batch_size(). Not a key.
  // Every rank's share of a micro-step, in rank order, once resolve_batch_size() has run (global-
  // batch mode; empty before and in per-rank mode). Not a key.
  std::vector<std::int64_t> shares;
  int num_workers = 2;           // 0..64 loader threads (0: batches built by the training thread)
  bool augment = false;          // random crop (4-pixel zero padding) and horizontal flip
  std::int64_t train_limit = 0;  // 0..2^40: only the first N training samples; 0 = all
  std::int64_t test_limit = 0;   // the same for the test split
  // image-folder only (0..4096): shorter side resized to this, then centre-cropped; 0 = keep.
  int image_size = 0;
  // Normalisation in [0, 1] pixel units: 1 value (every channel) or one per channel, at most
  // 64; each mean in [-1, 2], each std in (0, 100]. Empty: the dataset's own statistics.
  std::vector<double> mean;
  std::vector<double> std;
  // synthetic only: 1..10000000 generated samples per split
  std::int64_t synthetic_train = 5000;
  std::int64_t synthetic_test = 1000;
};

struct ModelConfig {
  ModelName name = ModelName::kDigitalNet;
  // 1..4096: channels of the first convolution (doubled at each later stage) for digitalnet
  // and resnet18; hidden units for mlp.
  int width = 64;
  Norm norm = Norm::kBatch;  // batch: BatchNorm after each convolution; none: no normalisation
  // A module saved from Python (torch.jit.script / trace), an existing file; set, it is the
  // model, and name, width and norm must be left out.
  std::string torchscript;
  // BatchNorm statistics reduced across ranks: strategy ddp or single only, and a built-in
  // model with norm batch (not mlp, not torchscript).
  bool sync_batchnorm = false;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::kSgd;
  double lr = 0.05;  // 0..1e6; unset with adamw: 1e-3, PyTorch's default
  // 0..1000. sgd: L2 added to the gradient; adamw: decoupled. Unset with adamw: 0.01, PyTorch's.
  double weight_decay = 5.0e-4;
  double momentum = 0.9;  // sgd only, 0..1
  bool nesterov = false;  // sgd only; needs momentum > 0
  double beta1 = 0.9;     // adamw only (betas: [beta1, beta2], each 0..0.999999)
  double beta2 = 0.999;
  double eps = 1.0e-8;  // adamw only, 1e-30..1
};

// The learning rate at each optimizer step (see lr_schedule.h): a linear warmup over
// warmup_steps, then constant, step or cosine. A key of another schedule is refused.
struct ScheduleConfig {
  ScheduleName name = ScheduleName::kConstant;
  std::int64_t warmup_steps = 0;  // 0..2^40 optimizer steps
  // step only, and required there: 1..2^40 optimizer steps between decays, counted after warmup
  std::int64_t step_size = 0;
  double gamma = 0.1;   // step only, 0..1: the factor of each decay
  double min_lr = 0.0;  // cosine only, 0..lr: the rate it reaches at the run's last step
};

struct TrainConfig {
  int epochs = 10;             // 1..100000
  std::int64_t max_steps = 0;  // 0..2^40 optimizer steps, then the run ends; 0 = no cap
  int accumulate_steps = 1;    // 1..65536 batches whose gradients make one optimizer step
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  double label_smoothing = 0.0;  // 0..1, of the training loss; test_loss stays plain cross-entropy
  double clip_grad_norm = 0.0;   // 0..1e9: max global L2 norm of the averaged gradients; 0 = off
  // f32 | bf16 | f16: autocast of the forward passes; f16 (with a loss scaler) needs a CUDA
  // device and is refused with device cpu.
  Precision precision = Precision::kF32;
  int threads = 0;     // 0..1024 intra-op threads per rank; 0: the cores / ranks on the node
  int log_every = 20;  // 1..2^31-1 optimizer steps between metrics.jsonl step lines
  // none | optimizer | gradients (strategy ddp only, not with comm.compression powersgd): each
  // rank keeps and steps only its slice of the optimizer state (optimizer), and of the averaged
  // gradients too (gradients); the parameters are allgathered after each step.
  Shard shard = Shard::kNone;
};

// checkpoint.resume: auto (the newest complete checkpoint under OUTPUT/checkpoints, if any),
// never (start afresh), or the path of a checkpoint file, which must exist.
enum class ResumeMode : std::uint8_t { kAuto, kNever, kPath };
struct ResumeFrom {
  ResumeMode mode = ResumeMode::kAuto;
  std::string path;  // kPath only
};

struct CheckpointConfig {
  // 0..100000: a checkpoint every N epochs and at the last; 0 = none. best.pt (the best test
  // accuracy so far) is written either way.
  int every_epochs = 1;
  // 0..2^40: also a checkpoint every N optimizer steps, mid-epoch too; 0 = none.
  std::int64_t every_steps = 0;
  // 0..1e9 s: also a checkpoint at the first step after this much wall-clock time since the
  // last one (rank 0's clock decides, so every rank saves the same step); 0 = none.
  double every_seconds = 0;
  int keep = 3;  // 1..100000 newest checkpoints kept, epoch and step ones together
  ResumeFrom resume;
};

// Where a run's time goes (trainer/observe): the breakdown and the straggler verdict are always
// measured; the trace is written when asked for, the TensorBoard events unless turned off.
struct ObserveConfig {
  bool trace = false;  // trace.json in rank 0's output folder (Chrome trace-event format)
  // trace_steps: [first, last], the optimizer steps traced, 0-based and inclusive; at most
  // kMaxTraceSteps of them. The default skips the first steps, which warm up.
  std::int64_t trace_first_step = 10;
  std::int64_t trace_last_step = 29;
  // Rank 0's TensorBoard event file (events.out.tfevents.*) in the output folder: the loss and
  // learning rate per optimizer step, the test figures, throughput and breakdown per epoch.
  bool tensorboard = true;
};
inline constexpr std::int64_t kMaxTraceSteps = 1000;

struct Config {
  std::string source;                         // the file it was loaded from
  std::string name = "run";                   // any UTF-8 text; names the default output.dir
  std::uint64_t seed = 0;                     // 0..2^63-1
  DeviceChoice device = DeviceChoice::kAuto;  // auto: cuda when LibTorch sees a GPU
  // ddp: one process per rank (launch.nproc_per_node); dp: DataParallel over the GPUs of one
  // process; single: one process, one device.
  StrategyKind strategy = StrategyKind::kSingle;
  LaunchConfig launch;
  CommConfig comm;
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  CheckpointConfig checkpoint;
  ObserveConfig observe;
  std::string output_dir = "runs/run";  // output.dir; unset: runs/NAME
  std::string reference;  // an existing parity reference file (docs/parity.md); empty: none
};

// Reads and validates the YAML file, then applies each "key.path=value" override in order.
// Every error is a UsageError whose message starts with "FILE:LINE:COL: " and names the key
// (overrides use "--set key.path" as their location).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Samples per micro-step over all ranks in global-batch mode: data.global_batch_size /
// train.accumulate_steps (load_config() checked that it divides); 0 in per-rank mode.
std::int64_t micro_batch_size(const Config& config);

// Global-batch mode: sets data.shares to every rank's share of a micro-step (data.balance: even
// M / world_size, or by the weights; auto starts even, rounded by largest remainder when W does
// not divide M) and data.batch_size to rank `rank`'s (world_size: the ranks of strategy ddp; 1
// for single and dp, whose one process takes the whole batch). Throws UsageError
// "FILE:LINE:COL: data.global_batch_size: ..." (or data.balance) with the numbers when the
// ranks cannot split M so, or the weights do not fit the ranks. Per-rank mode: changes nothing.
void resolve_batch_size(Config& config, int world_size, int rank = 0);

// The resolved config as YAML text (what `partrain validate` prints) and as JSON text
// (embedded in report.json); both load back as the same Config. In global-batch mode
// data.batch_size is null until resolve_batch_size() has run, then the rank's share: a
// resolved config (report.json's) names both batch keys, and loads again without that one.
std::string config_to_yaml(const Config& config);
std::string config_to_json(const Config& config);

}  // namespace partrain
