// defines: RankData and load_rank_data() — the data sets one rank reads and its loaders: its
// shard of the shuffled training set (in global-batch mode its slices of the batch plan) and of
// the test set.
#pragma once

#include <chrono>
#include <memory>

#include "comm_backends/store/store.h"
#include "trainer/config/config.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"
#include "trainer/loop/worker.h"

namespace partrain {

struct RankData {
  std::shared_ptr<const data::ImageDataset> train_set;
  std::shared_ptr<const data::ImageDataset> test_set;
  std::unique_ptr<data::Loader> train;  // shuffled per epoch, augmented if asked
  std::unique_ptr<data::Loader> test;   // in order, never augmented
};

// Loads both splits. With several ranks on a host (and a store to meet through), the host's
// first rank loads (and, if asked, downloads) first and the others after it, so a download
// happens once per machine; `timeout` bounds the others' wait, plus the download's own bounds.
RankData load_rank_data(const Config& config, const WorkerEnv& env, comm::Store* store,
                        std::chrono::milliseconds timeout);

}  // namespace partrain
