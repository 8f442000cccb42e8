// defines: StrategyState and SavedStrategyState — what a Strategy hands a checkpoint (entries
// of its dict; a sharded strategy also a shard of its own, which its rank writes) and what it
// is handed back on resume (the dict, and each shard through a collective read).
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/optim/optimizer_state.h"

namespace partrain {

struct StrategyState {
  // Entries of the checkpoint's dict beside "format", "model" and "meta": "optimizer" (and
  // "powersgd" with compression), on the writing rank.
  std::vector<std::pair<std::string, c10::IValue>> entries;
  // A sharded strategy: this rank's own part (its slice of the optimizer state), which this
  // rank writes to a shard file beside the checkpoint (checkpoint.cpp).
  std::optional<c10::IValue> shard;
};

struct SavedStrategyState {
  std::string path;  // the checkpoint, for messages
  // The checkpoint's dict, every entry; the same on every rank.
  c10::impl::GenericDict checkpoint{c10::StringType::get(), c10::AnyType::get()};
  int written_by = 0;  // the world size of the run that wrote it
  // A checkpoint of a sharded run: how many shard files it has, and shard s's content. Reading
  // one is a collective (one rank reads the file, every rank receives it): every rank calls it
  // for the same shards in the same order.
  int shards = 0;
  std::function<c10::IValue(int shard)> read_shard;
};

// The checkpoint's optimizer state, whole or in shards.
inline SavedOptimizerState saved_optimizer(const SavedStrategyState& saved) {
  return SavedOptimizerState(saved.checkpoint.at("optimizer"), saved.shards, saved.read_shard,
                             saved.path);
}

}  // namespace partrain
