#include "trainer/data/loader.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "trainer/data/counter_rng.h"

namespace partrain::data {

namespace {

constexpr int kCropPadding = 4;

}  // namespace

// Worker w of N builds batches first+w, first+w+N, ... of the epoch, each at most
// N * prefetch_batches ahead of the next batch next() will hand out, and files them under
// their batch number; next() takes them strictly in number order. So the sequence is the
// same for any N, and memory is bounded by the look-ahead.
struct Loader::State {
  std::shared_ptr<const ImageDataset> dataset;
  DistributedSampler sampler;
  std::optional<BatchPlan> plan;  // global-batch mode: the epoch's order comes from here
  int rank = 0;
  LoaderOptions options;
  std::vector<float> lut;  // channels x 256: normalised value of each pixel byte

  std::int64_t epoch = 0;
  std::vector<std::int64_t> order;  // this rank's dataset indices for the epoch
  std::int64_t batches = 0;
  std::int64_t next_batch = 0;
  bool started = false;

  std::mutex mu;
  std::condition_variable batch_ready;
  std::condition_variable consumer_moved;
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  std::map<std::int64_t, Slot> done;
  bool stop = false;
  std::vector<std::thread> workers;

  State(std::shared_ptr<const ImageDataset> d, DistributedSampler s, LoaderOptions o)
      : dataset(std::move(d)), sampler(std::move(s)), options(o) {}

  // This rank's dataset indices of epoch `e`, in visiting order; batch k is [k*b, (k+1)*b).
  std::vector<std::int64_t> epoch_order(std::int64_t e) const {
    return plan ? plan->rank_indices(e, rank) : sampler.indices(e);
  }
  Batch build(std::int64_t batch_epoch, const std::vector<std::int64_t>& indices,
              std::int64_t k) const;
  void work(int worker, std::int64_t first);
  void stop_workers();
};

Batch Loader::State::build(std::int64_t batch_epoch, const std::vector<std::int64_t>& indices,
                           std::int64_t k) const {
  const ImageDataset& d = *dataset;
  const std::int64_t b = options.batch_size;
  const std::int64_t begin = k * b;
  const std::int64_t count =
      std::min<std::int64_t>(b, static_cast<std::int64_t>(indices.size()) - begin);
  const int C = d.channels, H = d.height, W = d.width;
  Batch batch;
  batch.index = k;
  batch.count = count;
  batch.images = at::empty({count, C, H, W}, at::kFloat);
  batch.labels = at::empty({count}, at::kLong);
  float* out = batch.images.data_ptr<float>();
  std::int64_t* labels = batch.labels.data_ptr<std::int64_t>();
  const std::int64_t plane = static_cast<std::int64_t>(H) * W;
  for (std::int64_t j = 0; j < count; ++j) {
    const std::int64_t idx = indices[static_cast<std::size_t>(begin + j)];
    labels[j] = d.labels[static_cast<std::size_t>(idx)];
    const std::uint8_t* src = d.image(idx);
    float* dst = out + j * C * plane;
    if (!options.augment) {
      for (int c = 0; c < C; ++c) {
        const float* lut_c = lut.data() + c * 256;
        for (std::int64_t p = 0; p < plane; ++p) dst[c * plane + p] = lut_c[src[c * plane + p]];
      }
      continue;
    }
    // torchvision's RandomCrop(size, padding=4) then RandomHorizontalFlip: output (y, x)
    // reads the zero-padded source at (y + dy, x' + dx), x' = x or W-1-x.
    CounterRng rng(mix_seed(options.seed, 0xa06e, static_cast<std::uint64_t>(batch_epoch),
                            static_cast<std::uint64_t>(idx)));
    const int dy = static_cast<int>(rng.below(2 * kCropPadding + 1)) - kCropPadding;
    const int dx = static_cast<int>(rng.below(2 * kCropPadding + 1)) - kCropPadding;
    const bool flip = rng.below(2) == 1;
    for (int c = 0; c < C; ++c) {
      const float* lut_c = lut.data() + c * 256;
      for (int y = 0; y < H; ++y) {
        const int sy = y + dy;
        for (int x = 0; x < W; ++x) {
          const int sx = (flip ? W - 1 - x : x) + dx;
          const bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
          dst[c * plane + y * W + x] = lut_c[inside ? src[c * plane + sy * W + sx] : 0];
        }
      }
    }
  }
  return batch;
}

void Loader::State::work(int worker, std::int64_t first) {
  const std::int64_t stride = options.num_workers;
  const std::int64_t ahead =
      static_cast<std::int64_t>(options.num_workers) * std::max(1, options.prefetch_batches);
  for (std::int64_t k = first + worker; k < batches; k += stride) {
    {
      std::unique_lock<std::mutex> lock(mu);
      // Bounded by the loader's lifetime: stop_workers() sets stop and wakes us.
      consumer_moved.wait(lock, [&] { return stop || k < next_batch + ahead; });
      if (stop) return;
    }
    Slot slot;
    try {
      slot.batch = build(epoch, order, k);
    } catch (...) {
      slot.error = std::current_exception();
    }
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      done[k] = std::move(slot);
    }
    batch_ready.notify_all();
    if (failed) return;
  }
}

void Loader::State::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  consumer_moved.notify_all();
  for (auto& t : workers) t.join();
  workers.clear();
  std::lock_guard<std::mutex> lock(mu);
  done.clear();
  stop = false;
}

Loader::Loader(std::shared_ptr<const ImageDataset> dataset, BatchPlan plan, int rank,
               LoaderOptions options)
    : Loader(dataset,
             DistributedSampler(plan.dataset_size(), {plan.world_size(), rank, options.seed, true}),
             [&] {
               options.batch_size = plan.share(rank);
               return options;
             }()) {
  state_->plan = std::move(plan);
  state_->rank = rank;
  // Every micro-step holds a whole share, the last one wrapping to the epoch's start.
  state_->batches = state_->plan->num_steps();
}

Loader::Loader(std::shared_ptr<const ImageDataset> dataset, DistributedSampler sampler,
               LoaderOptions options)
    : state_(std::make_unique<State>(std::move(dataset), std::move(sampler), options)) {
  const ImageDataset& d = *state_->dataset;
  PARTRAIN_CHECK(options.batch_size >= 1, UsageError, "batch size must be >= 1, not ",
                 options.batch_size);
  PARTRAIN_CHECK(options.num_workers >= 0, UsageError, "num_workers must be >= 0, not ",
                 options.num_workers);
  PARTRAIN_CHECK(options.timeout_s > 0, UsageError, "loader timeout must be positive");
  PARTRAIN_CHECK(state_->sampler.dataset_size() == d.size, Error, "sampler covers ",
                 state_->sampler.dataset_size(), " samples but dataset '", d.name, "' has ",
                 d.size);
  PARTRAIN_CHECK(d.mean.size() == static_cast<std::size_t>(d.channels) &&
                     d.std.size() == static_cast<std::size_t>(d.channels),
                 Error, "dataset '", d.name, "' needs a mean and std per channel");
  PARTRAIN_CHECK(static_cast<std::int64_t>(d.pixels.size()) == d.size * d.sample_bytes() &&
                     static_cast<std::int64_t>(d.labels.size()) == d.size,
                 Error, "dataset '", d.name, "' has inconsistent sizes");
  state_->lut.resize(static_cast<std::size_t>(d.channels) * 256);
  for (int c = 0; c < d.channels; ++c) {
    for (int v = 0; v < 256; ++v) {
      state_->lut[static_cast<std::size_t>(c) * 256 + v] =
          (static_cast<float>(v) / 255.0f - d.mean[c]) / d.std[c];
    }
  }
  state_->batches = state_->sampler.num_batches(options.batch_size);
}

Loader::~Loader() { state_->stop_workers(); }

void Loader::start_epoch(std::int64_t epoch, std::int64_t first_batch) {
  State& s = *state_;
  s.stop_workers();
  PARTRAIN_CHECK(first_batch >= 0 && first_batch <= s.batches, UsageError, "batch ", first_batch,
                 " is outside the epoch's 0..", s.batches);
  s.epoch = epoch;
  s.order = s.epoch_order(epoch);
  s.next_batch = first_batch;
  s.started = true;
  for (int w = 0; w < s.options.num_workers; ++w) {
    s.workers.emplace_back([&s, w, first_batch] { s.work(w, first_batch); });
  }
}

std::optional<Batch> Loader::next() {
  State& s = *state_;
  PARTRAIN_CHECK(s.started, Error, "Loader::next() called before start_epoch()");
  if (s.next_batch >= s.batches) return std::nullopt;
  const std::int64_t k = s.next_batch;
  if (s.options.num_workers == 0) {
    Batch batch = s.build(s.epoch, s.order, k);
    ++s.next_batch;
    return batch;
  }
  State::Slot slot;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    const auto timeout = std::chrono::duration<double>(s.options.timeout_s);
    const bool arrived = s.batch_ready.wait_for(lock, timeout, [&] { return s.done.count(k) > 0; });
    PARTRAIN_CHECK(arrived, Error, "data loader: batch ", k, " of epoch ", s.epoch,
                   " not ready after ", s.options.timeout_s, " s; loader thread ",
                   k % s.options.num_workers, " is stuck");
    auto it = s.done.find(k);
    slot = std::move(it->second);
    s.done.erase(it);
    ++s.next_batch;
  }
  s.consumer_moved.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

void Loader::set_shares(const std::vector<std::int64_t>& shares) {
  State& s = *state_;
  PARTRAIN_CHECK(s.plan.has_value(), Error, "Loader::set_shares needs a batch plan");
  BatchPlan plan = s.plan->with_shares(shares);
  s.stop_workers();
  s.options.batch_size = plan.share(s.rank);
  s.plan = std::move(plan);
  if (!s.started) return;
  // The batches already built were cut by the old shares: the workers start again at the
  // next batch, from the new order of the same epoch.
  s.order = s.epoch_order(s.epoch);
  const std::int64_t first = s.next_batch;
  for (int w = 0; w < s.options.num_workers; ++w) {
    s.workers.emplace_back([&s, w, first] { s.work(w, first); });
  }
}

std::int64_t Loader::num_batches() const { return state_->batches; }
const DistributedSampler& Loader::sampler() const { return state_->sampler; }
const ImageDataset& Loader::dataset() const { return *state_->dataset; }

Batch Loader::make_batch(std::int64_t epoch, std::int64_t batch_index) const {
  const State& s = *state_;
  PARTRAIN_CHECK(batch_index >= 0 && batch_index < s.batches, UsageError, "batch ", batch_index,
                 " is outside the epoch's 0..", s.batches - 1);
  return s.build(epoch, s.epoch_order(epoch), batch_index);
}

}  // namespace partrain::data
