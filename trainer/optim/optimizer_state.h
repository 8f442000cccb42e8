// defines: ParamState, StatePiece, SavedOptimizerState, StateAssembly and ShardBlock — an
// optimizer's state as checkpoints hold it, read the same way whatever wrote it: a whole state per
// parameter (the "optimizer" entry of an unsharded run), or shard files in which each rank of a
// sharded run wrote its blocks of the flattened parameters. Either is read as pieces (elements
// [begin, end) of one parameter's flattened state), which a StateAssembly copies into whatever
// layout the resuming run keeps: whole tensors, or this rank's blocks at any world size.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/config/config_enums.h"

namespace c10 {
struct IValue;
}

namespace partrain {

// The "format" of a shard file's dict.
inline constexpr const char* kCheckpointShardFormat = "partrain.checkpoint-shard/1";

// What an optimizer holds for one parameter (or block): adamw's step, and its tensors by key
// ("momentum_buffer"; "exp_avg", "exp_avg_sq"[, "max_exp_avg_sq"]); no tensors: none yet.
struct ParamState {
  std::optional<std::int64_t> step;
  std::map<std::string, at::Tensor> tensors;
};

// Elements [begin, end) of parameter `name`'s state, flattened: each tensor 1-D of end - begin
// elements ("momentum_buffer"; "exp_avg", "exp_avg_sq"[, "max_exp_avg_sq"]); `step` for adamw.
struct StatePiece {
  std::string name;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::optional<std::int64_t> step;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// One rank's block of one bucket of a sharded run, as its shard file holds it: the bucket's
// parameters (names, offsets in elements from the bucket's start, element counts), the block's
// range [begin, end) in the bucket, and the optimizer's state over that range.
struct ShardBlock {
  std::vector<std::string> names;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> numels;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  ParamState state;  // tensors of end - begin elements each
};

// A shard file's dict: format, rank, world size, the optimizer's name and this rank's blocks.
c10::IValue shard_to_ivalue(int rank, int world_size, OptimizerName optimizer,
                            const std::vector<ShardBlock>& blocks);

class SavedOptimizerState {
 public:
  // `entry`: the checkpoint's "optimizer" entry; `shards` > 0: it is a sharded run's, whose
  // shard s read_shard(s) returns (a collective on every rank). `path`: for messages.
  SavedOptimizerState(const c10::IValue& entry, int shards,
                      std::function<c10::IValue(int)> read_shard, std::string path);
  ~SavedOptimizerState();
  // How many shards `entry` (a checkpoint's "optimizer" entry) says its state was written in:
  // 0 where it is whole. A UsageError naming `path` where the count is not a whole number of
  // at least 1.
  static int shards_of(const c10::IValue& entry, const std::string& path);

  // Throws UsageError when the checkpoint's optimizer is not `expected`.
  void check_optimizer(OptimizerName expected) const;
  // Every piece of the state, shard after shard (each read once and dropped), so that no more
  // than one shard is held at a time.
  void for_each_piece(const std::function<void(const StatePiece&)>& take) const;
  const std::string& path() const { return path_; }

 private:
  std::string name_;
  std::unique_ptr<c10::IValue> entry_;
  int shards_ = 0;
  std::function<c10::IValue(int)> read_shard_;
  std::string path_;
};

// Gathers pieces into destinations: flat state tensors of `elements` each (a parameter's whole
// state, or this rank's block of a bucket), each region of which comes from one parameter's
// flattened range. A destination either receives no state at all (the optimizer had none yet:
// SGD before its first step) or every region of it; anything between is refused.
class StateAssembly {
 public:
  explicit StateAssembly(std::string path) : path_(std::move(path)) {}
  std::size_t add_destination(std::int64_t elements, const at::TensorOptions& options);
  // Elements [begin, end) of parameter `name` land at `at` in destination `d`.
  void add_region(const std::string& name, std::size_t d, std::int64_t at, std::int64_t begin,
                  std::int64_t end);
  void take(const StatePiece& piece);

  // Destination d's state; throws UsageError when only some of its regions arrived.
  ParamState result(std::size_t d) const;

 private:
  struct Region {
    std::size_t d = 0;
    std::int64_t at = 0, begin = 0, end = 0;
  };
  struct Destination {
    std::int64_t elements = 0;
    std::int64_t needed = 0;  // elements some region maps to
    std::int64_t filled = 0;
    at::TensorOptions options;
    ParamState state;
  };
  std::string path_;
  std::vector<Destination> destinations_;
  std::map<std::string, std::vector<Region>> regions_;
};

}  // namespace partrain
