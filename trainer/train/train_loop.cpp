// One rank's run. The shape, for strategy ddp (single and dp are the same loop without the
// communicator, dp with the batch split over the visible GPUs inside the step):
//
//   pick device (set it before any other device work) -> rendezvous -> load data
//   -> build model (same seed everywhere) -> broadcast rank 0's parameters and buffers
//   -> [resume from checkpoint] -> for each epoch: train steps (Reducer overlaps the
//   gradient allreduce with backward), evaluate on this rank's shard of the test set,
//   reduce loss/accuracy over ranks, log, checkpoint -> gather per-rank figures -> report.
#include "trainer/train/train_loop.h"

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "comm_backends/communicator.h"
#include "comm_backends/net/local_address.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "common/stopwatch.h"
#include "common/temp_dir.h"
#include "trainer/data/dataset.h"
#include "trainer/data/download.h"
#include "trainer/data/loader.h"
#include "trainer/data/tensor_file.h"
#include "trainer/train/checkpoint.h"
#include "trainer/train/device_memory.h"
#include "trainer/train/process_memory.h"
#include "trainer/train/progress.h"
#include "trainer/train/reducer.h"
#include "trainer/train/report_writer.h"
#include "trainer/train/tensor_buffer.h"
#include "trainer/train/torch_info.h"
#include "trainer/train/train_model.h"

namespace partrain {
namespace {

torch::Device pick_device(const Config& cfg, const WorkerEnv& env) {
  int gpus = cuda_device_count();
  bool want_cuda = cfg.device == "cuda" || (cfg.device == "auto" && gpus > 0);
  if (cfg.strategy == "dp" && gpus == 0) {
    throw UsageError(
        "strategy dp (DataParallel) replicates the model over CUDA devices, and this machine "
        "has none visible to LibTorch; use strategy: ddp with device: cpu instead");
  }
  if (!want_cuda) return torch::Device(torch::kCPU);
  if (gpus == 0) {
    throw UsageError("device: cuda, but LibTorch sees no CUDA device here (" + torch_version() +
                     "); use device: cpu or auto");
  }
  int index = env.local_rank % gpus;
  select_cuda_device(index);
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void set_threads(const Config& cfg, const WorkerEnv& env) {
  int threads = cfg.train.threads;
  if (threads == 0) {
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, env.local_world_size));
  }
  torch::set_num_threads(threads);
}

// Sums `values` over all ranks (in place, f64). They travel as a tensor on the training
// device, because a backend such as nccl only reads device memory.
void sum_over_ranks(comm::Communicator* comm, std::vector<double>& values,
                    const torch::Device& device) {
  if (!comm || comm->size() == 1 || values.empty()) return;
  auto t = torch::tensor(values, torch::kFloat64).to(device);
  allreduce_tensor(*comm, t, comm::ReduceOp::sum);
  t = t.cpu();
  std::copy(t.data_ptr<double>(), t.data_ptr<double>() + values.size(), values.begin());
}

// The rendezvous master's host: the tcp store's, else MASTER_ADDR (a file store shared by
// ranks that torchrun started), else none.
std::string master_host(const std::string& rendezvous) {
  if (rendezvous.rfind("tcp://", 0) == 0 || rendezvous.rfind("env://", 0) == 0) {
    return comm::parse_store_url(rendezvous).host;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  return addr != nullptr ? addr : "";
}

std::vector<torch::Tensor> state_tensors(const torch::nn::Module& model) {
  std::vector<torch::Tensor> tensors = model.parameters();
  for (const auto& b : model.buffers()) tensors.push_back(b);
  return tensors;
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

// strategy dp: the model replicated over the visible GPUs for each forward, the batch split
// between them, the outputs gathered on `device` (Note [DataParallel]).
torch::Tensor forward(TrainModel& model, const torch::Tensor& input,
                      const std::vector<torch::Device>& dp_devices, const torch::Device& device) {
  if (dp_devices.empty()) return model.forward(input);
  return model.forward_data_parallel(input, dp_devices, device);
}

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
};

// Each rank evaluates positions r, r+W, ... of the unshuffled test set; the sampler pads the
// last round with repeats, which are cut off here so every test sample counts exactly once.
EvalResult evaluate(TrainModel& model, data::Loader& loader, comm::Communicator* comm,
                    const torch::Device& device, const std::vector<torch::Device>& dp_devices) {
  torch::NoGradGuard no_grad;
  model.module().eval();
  const auto& sampler = loader.sampler();
  const int64_t W = sampler.options().world_size, r = sampler.options().rank;
  const int64_t n = sampler.dataset_size();
  int64_t remaining = (n - r + W - 1) / W;  // real (unpadded) samples of this rank
  double loss_sum = 0, correct = 0, count = 0;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    int64_t valid = std::min<int64_t>(remaining, batch->count);
    remaining -= valid;
    if (valid <= 0) continue;
    auto images = batch->images.narrow(0, 0, valid).to(device, /*non_blocking=*/true);
    auto labels = batch->labels.narrow(0, 0, valid).to(device, true);
    torch::Tensor out = forward(model, images, dp_devices, device);
    loss_sum +=
        torch::nn::functional::cross_entropy(
            out, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
    correct += out.argmax(1).eq(labels).sum().item<double>();
    count += static_cast<double>(valid);
  }
  std::vector<double> sums{loss_sum, correct, count};
  sum_over_ranks(comm, sums, device);
  model.module().train();
  return {sums[0] / std::max(1.0, sums[2]), sums[1] / std::max(1.0, sums[2])};
}

}  // namespace

int run_worker(const Config& cfg, const WorkerEnv& env) {
  const auto run_start = Clock::now();
  const bool is_rank0 = env.rank == 0;
  set_threads(cfg, env);
  torch::Device device = pick_device(cfg, env);

  // Rendezvous. strategy ddp always has a communicator — with one rank too, so that a
  // one-rank run exercises the backend it names (and a rendezvous of its own, in a temporary
  // directory, when none is given); single and dp need none.
  std::optional<TempDir> own_rendezvous;  // declared first: outlives the store
  std::unique_ptr<comm::Store> store;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::Communicator> batchnorm_comm;  // model.sync_batchnorm's own (its note)
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.comm.timeout_s * 1000));
  PARTRAIN_CHECK(env.world_size == 1 || cfg.strategy == "ddp", UsageError, "strategy ",
                 cfg.strategy, " runs in one process, but the launch has ", env.world_size,
                 " ranks; use strategy: ddp");
  if (cfg.strategy == "ddp") {
    std::string rendezvous = env.rendezvous;
    if (rendezvous.empty() && env.world_size == 1) {
      own_rendezvous.emplace("partrain-rdzv");
      rendezvous = "file://" + own_rendezvous->path().generic_string();
    }
    PARTRAIN_CHECK(!rendezvous.empty(), UsageError,
                   "no rendezvous: set launch.rendezvous or start ranks with partrain run");
    // The address this rank listens on and publishes: one the other hosts can reach.
    comm::net::BindAddressRequest address;
    address.host = cfg.comm.host;
    address.interface = cfg.comm.interface;
    address.master_host = master_host(rendezvous);
    address.single_host = env.local_world_size >= env.world_size;
    const std::string bind_host = comm::net::choose_bind_address(address);
    comm::StoreOptions so;
    so.token = env.token;
    so.timeout = timeout;
    so.rank = env.rank;
    so.world_size = env.world_size;
    so.host_server = env.rank == 0;
    store = comm::open_store(rendezvous, so);
    comm::CommOptions co;
    co.backend = cfg.comm.backend;
    co.timeout = timeout;
    co.wire_dtype = comm::parse_dtype(cfg.comm.wire_dtype);
    co.device = device.is_cuda() ? comm::DeviceKind::cuda : comm::DeviceKind::cpu;
    co.device_index = device.is_cuda() ? device.index() : 0;
    co.token = env.token;
    co.bind_host = bind_host;
    comm = comm::make_communicator(co, *store, env.rank, env.world_size);
    if (cfg.model.sync_batchnorm) {
      batchnorm_comm = comm::make_communicator(co, *store, env.rank, env.world_size);
    }
  }

  // Data: the first local rank loads (and, if asked, downloads) first, the others after it,
  // so a download happens once per machine. They wait for it through the store, not a
  // collective: a download may take far longer than comm.timeout_s, and is bounded by its
  // own timeouts (DownloadOptions), which the wait adds to the usual bound.
  std::shared_ptr<const data::ImageDataset> train_set, test_set;
  auto load = [&] {
    data::DatasetSplits splits = data::load_splits(cfg.data, cfg.seed, &data::read_tensor_file);
    train_set = std::make_shared<data::ImageDataset>(std::move(splits.train));
    test_set = std::make_shared<data::ImageDataset>(std::move(splits.test));
  };
  if (store && env.local_world_size > 1) {
    const std::string loaded_key = "data-loaded/" + std::to_string(env.rank - env.local_rank);
    if (env.local_rank == 0) {
      try {
        load();
      } catch (const std::exception&) {
        store->set(loaded_key, {'f', 'a', 'i', 'l', 'e', 'd'});  // the others stop waiting
        throw;
      }
      store->set(loaded_key, {'o', 'k'});
    } else {
      const data::DownloadOptions download;
      const auto bound =
          timeout + (cfg.data.download
                         ? std::chrono::milliseconds(static_cast<int64_t>(
                               1000 * (download.connect_timeout_s + download.total_timeout_s)))
                         : std::chrono::milliseconds(0));
      store->wait({loaded_key}, bound);
      const std::vector<std::uint8_t> outcome = store->get(loaded_key);
      // The same files would fail here too: a usage error (exit 2), whichever rank exits first.
      PARTRAIN_CHECK(outcome == std::vector<std::uint8_t>({'o', 'k'}), UsageError, "rank ",
                     env.rank - env.local_rank, " could not load the data set (see its error)");
      load();
    }
  } else {
    load();
  }

  data::LoaderOptions lo;
  lo.batch_size = cfg.data.batch_size;
  lo.num_workers = cfg.data.num_workers;
  lo.augment = cfg.data.augment;
  lo.seed = cfg.seed;
  lo.timeout_s = cfg.comm.timeout_s;
  data::Loader train_loader(
      train_set,
      data::DistributedSampler(train_set->size, {env.world_size, env.rank, cfg.seed, true}), lo);
  data::LoaderOptions eval_lo = lo;
  eval_lo.augment = false;
  data::Loader test_loader(
      test_set,
      data::DistributedSampler(test_set->size, {env.world_size, env.rank, cfg.seed, false}),
      eval_lo);

  // Model: the same seed on every rank, then rank 0's state broadcast so that nothing
  // (e.g. a different LibTorch build) can make the replicas start apart.
  torch::manual_seed(cfg.seed);
  ModelShape shape{train_set->channels, train_set->height, train_set->num_classes,
                   train_set->width};
  std::unique_ptr<TrainModel> model_owner =
      make_train_model(cfg.model, shape, batchnorm_comm.get());
  TrainModel& model = *model_owner;
  model.module().to(device);
  if (comm) broadcast_from_rank0(state_tensors(model.module()), *comm);

  torch::optim::SGD optimizer(model.module().parameters(),
                              torch::optim::SGDOptions(cfg.train.optimizer.lr)
                                  .momentum(cfg.train.optimizer.momentum)
                                  .weight_decay(cfg.train.optimizer.weight_decay));

  std::vector<torch::Device> dp_devices;
  if (cfg.strategy == "dp") {
    for (int i = 0; i < cuda_device_count(); ++i) {
      dp_devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
    }
  }

  Checkpointer checkpointer(cfg, env);
  TrainingPosition position = checkpointer.resume(model.module(), optimizer, comm.get());
  if (position.epoch > 0 && is_rank0) {
    std::printf("resumed from %s: epoch %d done, %lld steps\n", position.source.c_str(),
                position.epoch, static_cast<long long>(position.step));
  }

  std::unique_ptr<Reducer> reducer;
  if (comm) {
    ReducerOptions ro;
    ro.bucket_mb = cfg.comm.bucket_mb;
    ro.timeout = timeout;
    reducer = std::make_unique<Reducer>(model.module().parameters(), *comm, ro);
  }

  std::unique_ptr<MetricsLog> metrics;
  std::vector<EpochRecord> epochs = checkpointer.previous_epochs();
  if (is_rank0) metrics = std::make_unique<MetricsLog>(cfg.output_dir, epochs);
  Progress progress(is_rank0);

  double compute_seconds = 0;
  int64_t step = position.step;
  const int accumulate = cfg.train.accumulate_steps;
  const int64_t batches = train_loader.num_batches();
  bool stop = cfg.train.max_steps > 0 && step >= cfg.train.max_steps;

  for (int epoch = position.epoch + 1; epoch <= cfg.train.epochs && !stop; ++epoch) {
    const auto epoch_start = Clock::now();
    if (!is_rank0) {  // the launcher names the epoch a rank was in from these lines
      std::printf("epoch %d/%d\n", epoch, cfg.train.epochs);
      std::fflush(stdout);
    }
    model.module().train();
    train_loader.start_epoch(epoch - 1);
    double loss_sum = 0, images = 0;
    torch::Tensor running_loss =
        torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    auto window_start = Clock::now();
    int64_t window_images = 0;
    int64_t batch_index = 0;
    while (auto batch = train_loader.next()) {
      const auto step_start = Clock::now();
      const double wait_before = reducer ? reducer->comm_wait_seconds() : 0;
      auto images_t = batch->images.to(device, true);
      auto labels_t = batch->labels.to(device, true);
      const bool sync = (batch_index + 1) % accumulate == 0 || batch_index + 1 == batches;
      // The gradient of a step is the mean over its group of batches; the last group of an
      // epoch may hold fewer than accumulate_steps of them.
      const int64_t group_start = batch_index - batch_index % accumulate;
      const int64_t group_size = std::min<int64_t>(accumulate, batches - group_start);
      torch::Tensor out = forward(model, images_t, dp_devices, device);
      auto loss = torch::nn::functional::cross_entropy(out, labels_t);
      if (reducer) reducer->prepare_for_backward(sync);
      (group_size > 1 ? loss / static_cast<double>(group_size) : loss).backward();
      if (sync) {
        if (reducer) reducer->finish_backward();
        optimizer.step();
        optimizer.zero_grad();
        ++step;
      }
      running_loss += loss.detach().to(torch::kFloat64) * static_cast<double>(batch->count);
      images += static_cast<double>(batch->count);
      window_images += batch->count;
      ++batch_index;
      compute_seconds +=
          seconds_since(step_start) - ((reducer ? reducer->comm_wait_seconds() : 0) - wait_before);

      const bool log_now = sync && (step % cfg.train.log_every == 0 || batch_index == batches);
      if (is_rank0 && (log_now || progress.on_terminal())) {
        double rate = window_images * env.world_size / std::max(1e-9, seconds_since(window_start));
        double current = loss.item<double>();
        progress.update(format("epoch %d/%d step %lld/%lld loss %.4f %.0f img/s", epoch,
                               cfg.train.epochs, static_cast<long long>(batch_index),
                               static_cast<long long>(batches), current, rate),
                        static_cast<double>(batch_index) / static_cast<double>(batches), log_now);
        if (log_now) {
          metrics->log_step(epoch, step, current, rate, cfg.train.optimizer.lr);
          window_start = Clock::now();
          window_images = 0;
        }
      }
      if (cfg.train.max_steps > 0 && step >= cfg.train.max_steps) {
        stop = true;
        break;
      }
    }
    loss_sum = running_loss.item<double>();
    const double train_seconds = seconds_since(epoch_start);

    if (comm)
      broadcast_from_rank0(model.module().buffers(), *comm);  // BN statistics of rank 0, as DDP
    EvalResult eval = evaluate(model, test_loader, comm.get(), device, dp_devices);
    std::vector<double> sums{loss_sum, images};
    sum_over_ranks(comm.get(), sums, device);

    EpochRecord record;
    record.epoch = epoch;
    record.train_seconds = train_seconds;
    record.seconds = seconds_since(epoch_start);
    record.images = static_cast<int64_t>(sums[1]);
    record.train_images_per_s = sums[1] / std::max(1e-9, train_seconds);
    record.steps = step;
    record.train_loss = sums[0] / std::max(1.0, sums[1]);
    record.test_loss = eval.loss;
    record.test_accuracy = eval.accuracy;
    epochs.push_back(record);
    if (is_rank0) {
      metrics->log_epoch(record);
      progress.finish(
          format("epoch %d/%d done in %.1f s: train loss %.4f, test loss %.4f, "
                 "test accuracy %.2f%%, %.0f img/s",
                 epoch, cfg.train.epochs, record.seconds, record.train_loss, record.test_loss,
                 100.0 * record.test_accuracy, record.train_images_per_s));
    }
    checkpointer.maybe_save(epoch, step, model.module(), optimizer, epochs, comm.get());
  }

  // Per-rank figures, gathered to rank 0 for the report.
  DeviceMemory mem = read_device_memory(device.is_cuda() ? device.index() : -1);
  const double kNone = std::nan("");
  std::vector<double> mine{peak_rss_mb(),
                           mem.peak_allocated_mb.value_or(kNone),
                           mem.peak_reserved_mb.value_or(kNone),
                           mem.driver_used_mb.value_or(kNone),
                           compute_seconds,
                           reducer ? reducer->comm_wait_seconds() : 0.0,
                           reducer ? reducer->comm_busy_seconds() : 0.0,
                           device.is_cuda() ? static_cast<double>(device.index()) : -1.0};
  const std::size_t kFields = mine.size();
  std::vector<double> all = mine;
  if (comm) {
    auto in = torch::tensor(mine, torch::kFloat64).to(device);
    auto out = torch::zeros({static_cast<int64_t>(kFields) * env.world_size}, in.options());
    allgather_tensor(*comm, in, out);
    out = out.cpu();
    all.assign(out.data_ptr<double>(), out.data_ptr<double>() + out.numel());
  }
  reducer.reset();

  if (is_rank0) {
    RunSummary summary;
    summary.config_json = config_to_json(cfg);
    summary.env.libtorch = torch_version();
    summary.env.backend = comm ? comm->name() : "none";
    summary.env.world_size = env.world_size;
    summary.env.strategy = cfg.strategy;
    if (device.is_cuda()) summary.env.cuda = describe_torch();
    auto optional = [](double v) {
      return std::isnan(v) ? std::optional<double>() : std::optional<double>(v);
    };
    for (int r = 0; r < env.world_size; ++r) {
      const double* f = &all[r * kFields];
      RankRecord rr;
      rr.rank = r;
      rr.device = f[7] < 0 ? "cpu" : "cuda:" + std::to_string(static_cast<int>(f[7]));
      rr.peak_rss_mb = f[0];
      rr.cuda_peak_allocated_mb = optional(f[1]);
      rr.cuda_peak_reserved_mb = optional(f[2]);
      rr.cuda_driver_used_mb = optional(f[3]);
      rr.compute_seconds = f[4];
      rr.comm_wait_seconds = f[5];
      rr.comm_busy_seconds = f[6];
      summary.env.devices.push_back(rr.device);
      summary.ranks.push_back(rr);
    }
    if (!dp_devices.empty()) {
      summary.env.devices.clear();
      for (const auto& d : dp_devices) summary.env.devices.push_back(d.str());
    }
    summary.epochs = epochs;
    double train_seconds = 0, images = 0;
    for (const auto& e : epochs) {
      train_seconds += e.train_seconds;
      images += static_cast<double>(e.images);
    }
    summary.total_seconds = seconds_since(run_start);
    summary.images_per_s = images / std::max(1e-9, train_seconds);
    write_report(cfg.output_dir, summary);
    std::printf(
        "report: %s/report.json (final test accuracy %.2f%%, %.0f img/s, peak RSS %.0f MiB)\n",
        cfg.output_dir.c_str(), epochs.empty() ? 0.0 : 100.0 * epochs.back().test_accuracy,
        summary.images_per_s, mine[0]);
    std::fflush(stdout);
  }
  if (comm) comm->barrier();
  return 0;
}

}  // namespace partrain
