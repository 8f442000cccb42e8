#include "trainer/loop/rank_data.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm_backends/backends/failure_trace.h"
#include "common/errors.h"
#include "common/worker_lines.h"
#include "trainer/data/batch_plan.h"
#include "trainer/data/download.h"
#include "trainer/data/sampler.h"
#include "trainer/data/tensor_file.h"

namespace partrain {

namespace {
// What a host's first rank sets under data-loaded/RANK when it could not load the data: this,
// then the reason of its error (reason_of()).
constexpr std::string_view kLoadFailed = "failed: ";

// How often a rank waiting for its host's first rank to load the data looks whether that rank
// stopped instead (a stop signal in its start-up, which ends it without setting the key): one
// wait and one check a slice, a few requests a second across a host of waiting ranks.
constexpr std::chrono::seconds kLoaderStoppedSlice{5};

// Waits up to `bound` for `loaded_key`, which rank `loader` sets once the data is loaded. Where
// the loader says it stopped (comm::why_rank_stopped(), RankGroup::tell_stopped()) the wait
// ends within kLoaderStoppedSlice, with a PeerError that ends with its reason, as a collective
// that lost it would: a stop in its start-up is then this rank's stop too (run_worker()).
void wait_for_loader(comm::Store& store, const std::string& loaded_key, int loader,
                     std::chrono::milliseconds bound) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + bound;
  for (;;) {
    const auto now = Clock::now();
    const auto slice = std::min<Clock::duration>(kLoaderStoppedSlice, deadline - now);
    const auto slice_end = now + slice;
    try {
      store.wait({loaded_key},
                 std::chrono::ceil<std::chrono::milliseconds>(std::max(slice, Clock::duration{})));
      return;
    } catch (const CommError&) {
      // Only a wait that ran out its slice: a store that failed sooner fails this rank.
      if (Clock::now() < slice_end || Clock::now() >= deadline) throw;
    }
    if (const auto why = comm::why_rank_stopped(store, loader, kLoaderStoppedSlice)) {
      throw PeerError(loader, "rank " + std::to_string(loader) +
                                  " stopped before it had loaded the data set for this host; " +
                                  *why);
    }
  }
}

}  // namespace

RankData load_rank_data(const Config& cfg, const WorkerEnv& env, comm::Store* store,
                        std::chrono::milliseconds timeout) {
  RankData d;
  auto load = [&] {
    data::DatasetSplits splits = data::load_splits(cfg.data, cfg.seed, &data::read_tensor_file);
    d.train_set = std::make_shared<data::ImageDataset>(std::move(splits.train));
    d.test_set = std::make_shared<data::ImageDataset>(std::move(splits.test));
  };
  // With data.download the host's first rank fetches the files while the others wait, so that
  // one rank downloads; otherwise every rank reads at once (one after another, W ranks of a
  // host would take W times as long to start). They wait through the store, not a
  // collective: a download may take far longer than comm.timeout_s, and is bounded by its own
  // timeouts (DownloadOptions), which the wait adds to the usual bound.
  if (store != nullptr && env.local_world_size > 1 && cfg.data.download) {
    const std::string loaded_key = "data-loaded/" + std::to_string(env.rank - env.local_rank);
    if (env.local_rank == 0) {
      try {
        load();
      } catch (const std::exception& e) {
        // The others stop waiting, and say why, as a rank that stopped tells its peers
        // (comm::RankGroup::tell_stopped()).
        const std::string failed = std::string(kLoadFailed) + reason_of(e.what());
        store->set(loaded_key, std::vector<std::uint8_t>(failed.begin(), failed.end()));
        throw;
      }
      store->set(loaded_key, {'o', 'k'});
    } else {
      const data::DownloadOptions download;
      const auto bound =
          timeout + std::chrono::milliseconds(static_cast<int64_t>(
                        1000 * (download.connect_timeout_s + download.total_timeout_s)));
      wait_for_loader(*store, loaded_key, env.rank - env.local_rank, bound);
      const std::vector<std::uint8_t> outcome = store->get(loaded_key);
      // The same files would fail here too: a usage error (exit 2), whichever rank exits first.
      const std::string said(outcome.begin(), outcome.end());
      PARTRAIN_CHECK(
          said == "ok", UsageError, "rank ", env.rank - env.local_rank,
          " could not load the data set: ",
          said.starts_with(kLoadFailed) ? said.substr(kLoadFailed.size()) : "(see its error)");
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
  if (cfg.data.global_batch_size > 0) {
    // Global-batch mode: the same micro-steps whatever the world size (batch_plan.h).
    d.train = std::make_unique<data::Loader>(
        d.train_set, data::BatchPlan(d.train_set->size, cfg.seed, cfg.data.shares), env.rank, lo);
  } else {
    d.train = std::make_unique<data::Loader>(
        d.train_set,
        data::DistributedSampler(d.train_set->size, {env.world_size, env.rank, cfg.seed, true}),
        lo);
  }
  data::LoaderOptions eval_lo = lo;
  eval_lo.augment = false;
  // Uneven shares would give a rank with a small one tiny test batches; the test set is split
  // evenly whatever the training split, so every rank takes the even batch (M / W, rounded up).
  if (cfg.data.global_batch_size > 0) {
    eval_lo.batch_size = (micro_batch_size(cfg) + env.world_size - 1) / env.world_size;
  }
  d.test = std::make_unique<data::Loader>(
      d.test_set,
      data::DistributedSampler(d.test_set->size, {env.world_size, env.rank, cfg.seed, false}),
      eval_lo);
  return d;
}

}  // namespace partrain
