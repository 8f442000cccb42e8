#include "trainer/loop/final_report.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "comm_backends/communicator.h"
#include "trainer/device/device_memory.h"
#include "trainer/report/process_memory.h"
#include "trainer/parallel/powersgd.h"
#include "trainer/parallel/tensor_buffer.h"
#include "trainer/device/torch_info.h"

namespace partrain {

void gather_and_write_report(const Config& cfg, const WorkerEnv& env, const c10::Device& device,
                             Strategy& strategy, double compute_seconds,
                             const std::vector<EpochRecord>& epochs, Clock::time_point run_start,
                             const RunObserver& observer,
                             const std::optional<BalanceRecord>& balance) {
  DeviceMemory mem = read_device_memory(device.is_cuda() ? device.index() : -1);
  const double kNone = std::nan("");
  std::vector<double> mine{peak_rss_mb(),
                           mem.peak_allocated_mb.value_or(kNone),
                           mem.peak_reserved_mb.value_or(kNone),
                           mem.driver_used_mb.value_or(kNone),
                           compute_seconds,
                           strategy.comm_wait_seconds(),
                           strategy.comm_busy_seconds(),
                           device.is_cuda() ? static_cast<double>(device.index()) : -1.0,
                           static_cast<double>(strategy.comm_bytes()),
                           static_cast<double>(strategy.comm_buckets()),
                           static_cast<double>(at::get_num_threads()),
                           static_cast<double>(std::max(1u, std::thread::hardware_concurrency())),
                           static_cast<double>(std::max(1, env.local_world_size))};
  const std::size_t kBreakdownAt = mine.size();
  const Breakdown breakdown = observer.breakdown();
  for (const auto& [name, part] : kBreakdownParts) mine.push_back(breakdown.*part);
  const std::size_t kFields = mine.size();
  std::vector<double> all = mine;
  if (comm::Communicator* comm = strategy.comm()) {
    auto in = at::tensor(mine, at::TensorOptions().dtype(at::kDouble)).to(device);
    auto out = at::zeros({static_cast<int64_t>(kFields) * env.world_size}, in.options());
    allgather_tensor(*comm, in, out);
    out = out.cpu();
    all.assign(out.data_ptr<double>(), out.data_ptr<double>() + out.numel());
  }
  strategy.stop();
  if (env.rank != 0) return;

  RunSummary summary;
  summary.config_json = config_to_json(cfg);
  summary.env.libtorch = torch_version();
  summary.env.backend = strategy.comm() ? strategy.comm()->name() : "none";
  summary.env.world_size = env.world_size;
  summary.env.strategy = name_of(cfg.strategy);
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
    rr.comm_bytes = static_cast<std::int64_t>(f[8]);
    rr.comm_buckets = static_cast<std::int64_t>(f[9]);
    rr.threads = static_cast<int>(f[10]);
    rr.host_cores = static_cast<int>(f[11]);
    rr.ranks_on_host = static_cast<int>(f[12]);
    Breakdown b;
    for (std::size_t p = 0; p < kBreakdownParts.size(); ++p) {
      b.*kBreakdownParts[p].second = f[kBreakdownAt + p];
    }
    rr.breakdown = b;
    summary.env.devices.push_back(rr.device);
    summary.ranks.push_back(rr);
  }
  if (!strategy.dp_devices().empty()) {
    summary.env.devices.clear();
    for (const auto& d : strategy.dp_devices()) summary.env.devices.push_back(d.str());
  }
  if (const PowerSgd* powersgd = strategy.powersgd()) {
    summary.compression =
        CompressionRecord{"powersgd",
                          cfg.comm.powersgd_rank,
                          cfg.comm.powersgd_start_step,
                          static_cast<std::int64_t>(powersgd->compressed_matrices()),
                          static_cast<std::int64_t>(powersgd->bytes_per_step()),
                          static_cast<std::int64_t>(powersgd->uncompressed_bytes_per_step())};
  }
  summary.epochs = epochs;
  summary.straggler = observer.straggler();
  summary.balance = balance;
  summary.startup = observer.startup();  // rank 0's: this is rank 0 writing
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

}  // namespace partrain
