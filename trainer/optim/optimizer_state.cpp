#include "trainer/optim/optimizer_state.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <limits>
#include <string>

#include "common/errors.h"
#include "trainer/optim/optimizer.h"

namespace partrain {
namespace {

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

UsageError unreadable(const std::string& path, const std::string& what) {
  return UsageError("checkpoint " + path + ": its optimizer state " + what);
}

// The state tensors of one parameter's (or block's) entry, and its step.
void read_state(const c10::impl::GenericDict& state, std::optional<std::int64_t>& step,
                std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  for (const auto& item : state) {
    const std::string& key = item.key().toStringRef();
    if (key == "step" && item.value().isInt()) {
      step = item.value().toInt();
    } else if (item.value().isTensor()) {
      tensors.emplace_back(key, item.value().toTensor());
    }
  }
}

std::vector<std::int64_t> int_list(const c10::IValue& v) { return v.toIntVector(); }

}  // namespace

c10::IValue shard_to_ivalue(int rank, int world_size, OptimizerName optimizer,
                            const std::vector<ShardBlock>& blocks) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (const ShardBlock& b : blocks) {
    c10::impl::GenericDict block = new_dict();
    c10::List<std::string> names;
    for (const auto& n : b.names) names.push_back(n);
    block.insert("names", names);
    block.insert("offsets", c10::List<std::int64_t>(b.offsets));
    block.insert("numels", c10::List<std::int64_t>(b.numels));
    block.insert("begin", b.begin);
    block.insert("end", b.end);
    c10::impl::GenericDict state = new_dict();
    if (b.state.step) state.insert("step", *b.state.step);
    for (const auto& [key, t] : b.state.tensors) state.insert(key, t);
    block.insert("state", state);
    list.push_back(block);
  }
  c10::impl::GenericDict shard = new_dict();
  shard.insert("format", std::string(kCheckpointShardFormat));
  shard.insert("rank", static_cast<std::int64_t>(rank));
  shard.insert("world_size", static_cast<std::int64_t>(world_size));
  shard.insert("optimizer", optimizer_name(optimizer));
  shard.insert("blocks", list);
  return shard;
}

SavedOptimizerState::SavedOptimizerState(const c10::IValue& entry, int shards,
                                         std::function<c10::IValue(int)> read_shard,
                                         std::string path)
    : entry_(std::make_unique<c10::IValue>(entry)),
      shards_(shards),
      read_shard_(std::move(read_shard)),
      path_(std::move(path)) {
  if (!entry.isGenericDict() || !entry.toGenericDict().contains("name")) {
    throw unreadable(path_, "is not readable");
  }
  name_ = entry.toGenericDict().at("name").toStringRef();
  if (shards_ == 0 && !entry.toGenericDict().contains("state")) {
    throw unreadable(path_, "is not readable");
  }
}

SavedOptimizerState::~SavedOptimizerState() = default;

int SavedOptimizerState::shards_of(const c10::IValue& entry, const std::string& path) {
  if (!entry.isGenericDict() || !entry.toGenericDict().contains("shards")) return 0;
  const c10::IValue& count = entry.toGenericDict().at("shards");
  PARTRAIN_CHECK(
      count.isInt() && count.toInt() >= 1 && count.toInt() <= std::numeric_limits<int>::max(),
      UsageError, "checkpoint ", path, ": its optimizer state's shard count is ",
      count.isInt() ? std::to_string(count.toInt()) : count.tagKind(),
      ", not a whole number of 1 or more");
  return static_cast<int>(count.toInt());
}

void SavedOptimizerState::check_optimizer(OptimizerName expected) const {
  const std::string name = optimizer_name(expected);
  PARTRAIN_CHECK(name_ == name, UsageError, "checkpoint ", path_, " was written with optimizer ",
                 name_, " and this run uses ", name,
                 "; use checkpoint.resume: never to start afresh");
}

void SavedOptimizerState::for_each_piece(const std::function<void(const StatePiece&)>& take) const {
  if (shards_ == 0) {
    // A whole state per parameter, in the parameter's shape.
    for (const auto& item : entry_->toGenericDict().at("state").toGenericDict()) {
      StatePiece piece;
      piece.name = item.key().toStringRef();
      read_state(item.value().toGenericDict(), piece.step, piece.tensors);
      if (piece.tensors.empty()) continue;
      piece.end = piece.tensors.front().second.numel();
      for (auto& [key, t] : piece.tensors) {
        if (t.numel() != piece.end) throw unreadable(path_, "of '" + piece.name + "' is ragged");
        t = t.reshape(-1);
      }
      take(piece);
    }
    return;
  }
  for (int s = 0; s < shards_; ++s) {
    const c10::IValue shard = read_shard_(s);
    if (!shard.isGenericDict())
      throw unreadable(path_, "shard " + std::to_string(s) + " is not a dict");
    const auto dict = shard.toGenericDict();
    const bool valid = dict.contains("format") && dict.at("format").isString() &&
                       dict.at("format").toStringRef() == kCheckpointShardFormat &&
                       dict.contains("optimizer") && dict.contains("blocks");
    if (!valid)
      throw unreadable(
          path_, "shard " + std::to_string(s) + " is not a " + kCheckpointShardFormat + " shard");
    PARTRAIN_CHECK(dict.at("optimizer").toStringRef() == name_, UsageError, "checkpoint ", path_,
                   ": shard ", s, " holds ", dict.at("optimizer").toStringRef(), " state, not ",
                   name_);
    for (const c10::IValue& b : dict.at("blocks").toListRef()) {
      const auto block = b.toGenericDict();
      const auto names = block.at("names").toListRef();
      const std::vector<std::int64_t> offsets = int_list(block.at("offsets"));
      const std::vector<std::int64_t> numels = int_list(block.at("numels"));
      const std::int64_t begin = block.at("begin").toInt(), end = block.at("end").toInt();
      std::optional<std::int64_t> step;
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      read_state(block.at("state").toGenericDict(), step, tensors);
      if (tensors.empty()) continue;
      for (const auto& [key, t] : tensors) {
        if (t.numel() != end - begin) throw unreadable(path_, "has a block of the wrong length");
      }
      // Each parameter's part of the block [begin, end).
      for (std::size_t i = 0; i < names.size() && i < offsets.size() && i < numels.size(); ++i) {
        const std::int64_t lo = std::max(begin, offsets[i]);
        const std::int64_t hi = std::min(end, offsets[i] + numels[i]);
        if (lo >= hi) continue;
        StatePiece piece;
        piece.name = names[i].toStringRef();
        piece.begin = lo - offsets[i];
        piece.end = hi - offsets[i];
        piece.step = step;
        for (const auto& [key, t] : tensors)
          piece.tensors.emplace_back(key, t.narrow(0, lo - begin, hi - lo));
        take(piece);
      }
    }
  }
}

std::size_t StateAssembly::add_destination(std::int64_t elements,
                                           const at::TensorOptions& options) {
  Destination d;
  d.elements = elements;
  d.options = options;
  destinations_.push_back(std::move(d));
  return destinations_.size() - 1;
}

void StateAssembly::add_region(const std::string& name, std::size_t d, std::int64_t at,
                               std::int64_t begin, std::int64_t end) {
  if (begin >= end) return;
  regions_[name].push_back({d, at, begin, end});
  destinations_.at(d).needed += end - begin;
}

void StateAssembly::take(const StatePiece& piece) {
  auto it = regions_.find(piece.name);
  if (it == regions_.end()) return;  // not this rank's (or not a parameter of this model)
  for (const Region& r : it->second) {
    const std::int64_t lo = std::max(r.begin, piece.begin), hi = std::min(r.end, piece.end);
    if (lo >= hi) continue;
    Destination& d = destinations_[r.d];
    // A piece that is a whole destination and the whole of its tensor's memory (a parameter's
    // state in an unsharded checkpoint) becomes the state itself: no second copy is made.
    const bool whole =
        r.at == 0 && lo == 0 && hi == d.elements && piece.begin == 0 && piece.end == d.elements;
    for (const auto& [key, t] : piece.tensors) {
      at::Tensor& target = d.state.tensors[key];
      if (!target.defined() && whole && t.is_contiguous() && t.dtype() == d.options.dtype() &&
          t.device() == d.options.device() &&
          t.storage().nbytes() == static_cast<std::size_t>(t.nbytes())) {
        target = t;
        continue;
      }
      if (!target.defined()) target = at::zeros({d.elements}, d.options);
      target.narrow(0, r.at + (lo - r.begin), hi - lo)
          .copy_(t.narrow(0, lo - piece.begin, hi - lo));
    }
    if (piece.step) d.state.step = piece.step;
    d.filled += hi - lo;
  }
}

ParamState StateAssembly::result(std::size_t d) const {
  const Destination& dest = destinations_.at(d);
  PARTRAIN_CHECK(dest.filled == 0 || dest.filled == dest.needed, UsageError, "checkpoint ", path_,
                 ": its optimizer state covers ", dest.filled, " of ", dest.needed,
                 " elements of a parameter or block; it does not fit this model");
  return dest.state;
}

}  // namespace partrain
