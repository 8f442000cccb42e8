#include "trainer/loop/final_report.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "comm_backends/communicator.h"
#include "trainer/device/device_memory.h"
#include "trainer/report/report_format.h"
#include "trainer/report/process_memory.h"
#include "trainer/parallel/tensor_buffer.h"
#include "trainer/device/torch_info.h"

namespace partrain {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The parts, each measured (final_report.h, RankMemory); what they leave of the peak resident
// memory is the unexplained rest. The step peak holds the buckets that sharded gradients
// allocate during backward, which the gradients count already.
MemoryBreakdown memory_breakdown(const RankMemory& m, double peak_rss_mb) {
  MemoryBreakdown b;
  b.floor = m.floor_mb;
  b.data = m.data_mb;
  b.parameters = static_cast<double>(m.held.parameters) / kMiB;
  b.gradients = static_cast<double>(m.held.gradients) / kMiB;
  b.optimizer_state = static_cast<double>(m.held.optimizer_state) / kMiB;
  b.communication = static_cast<double>(m.held.communication) / kMiB;
  b.activations = static_cast<double>(
                      std::max<std::int64_t>(0, m.step_peak_bytes - m.held.gradients_in_backward)) /
                  kMiB;
  b.unexplained = peak_rss_mb - (b.floor + b.data + b.parameters + b.gradients + b.optimizer_state +
                                 b.communication + b.activations);
  return b;
}

}  // namespace

void gather_and_write_report(const Config& cfg, const WorkerEnv& env, const c10::Device& device,
                             Strategy& strategy, double compute_seconds,
                             const std::vector<EpochRecord>& epochs, Clock::time_point run_start,
                             const RunObserver& observer,
                             const std::optional<BalanceRecord>& balance,
                             const std::optional<RankMemory>& memory) {
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
  // The memory breakdown, or NaN in its first slot where there is none (CUDA).
  const std::size_t kMemoryAt = mine.size();
  MemoryBreakdown held = memory ? memory_breakdown(*memory, mine[0]) : MemoryBreakdown{};
  if (!memory) held.floor = kNone;
  for (const auto& [name, part] : kMemoryParts) mine.push_back(held.*part);
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
    if (!std::isnan(f[kMemoryAt])) {
      MemoryBreakdown m;
      for (std::size_t p = 0; p < kMemoryParts.size(); ++p) {
        m.*kMemoryParts[p].second = f[kMemoryAt + p];
      }
      rr.memory = m;
    }
    summary.env.devices.push_back(rr.device);
    summary.ranks.push_back(rr);
  }
  if (const std::vector<std::string> spread = strategy.spread_devices(); !spread.empty()) {
    summary.env.devices = spread;
  }
  summary.compression = strategy.compression();
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
