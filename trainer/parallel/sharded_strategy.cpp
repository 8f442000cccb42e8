// Note [Sharded optimizer]
// ------------------------
// train.shard splits what each rank of ddp holds (ZeRO's stages: optimizer is stage 1,
// gradients stage 2). The Reducer's buckets are padded to a multiple of the world size W, and
// rank r owns the r-th W-th of every bucket, its block:
//
//   bucket b, padded:   [ rank 0's block | rank 1's block | ... | rank W-1's block ]
//   its parameters:     [ fc.weight        | fc.bias | conv4.weight ...         |pad]
//
// The model's parameters become views of one flat tensor per bucket in that same layout, so a
// rank's block of the parameters is one plain tensor, and the optimizer (LibTorch's SGD or
// AdamW: elementwise both, so stepping a block is stepping the parameters it spans) steps one
// such block per bucket, holding state for those elements only: 1/W of it. A block's gradient
// is, with train.shard optimizer, the same block of the Reducer's bucket once it is allreduced
// (a view: nothing is copied); with gradients, the rank's gradient shard, which the
// reduce-scatter of each bucket fills (Note [Sharded gradients] in reducer.cpp).
//
// An update, in order, all of it the same on every rank: the loss scale's verdict (each rank
// checks its blocks, the verdicts reduced); the clipping norm (each rank's sum of squares over
// its blocks, summed over the ranks); the optimizer's step on the blocks; and per bucket an
// allgather of the blocks into the flat parameters, after which every rank holds the whole
// updated parameters again. The padding's gradient is zero, so its elements never move.
#include "trainer/parallel/sharded_strategy.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "comm_backends/communicator.h"
#include "common/errors.h"
#include "trainer/optim/optimizer.h"
#include "trainer/parallel/reducer.h"
#include "trainer/parallel/strategy_state.h"
#include "trainer/parallel/tensor_buffer.h"
#include "trainer/precision/precision.h"

namespace partrain {

ShardedDdpStrategy::ShardedDdpStrategy(const Config& config, const c10::Device& device,
                                       comm::Communicator& comm)
    : DdpStrategy(config, device, comm), rank_(comm.rank()), world_(comm.size()) {}

ShardedDdpStrategy::~ShardedDdpStrategy() {
  reducer_.reset();  // its thread may still use the reduction
}

void ShardedDdpStrategy::make_optimizer(TrainModel& model) {
  const bool shard_gradients = config_.train.shard == Shard::kGradients;
  ReducerOptions ro;
  ro.bucket_mb = config_.comm.bucket_mb;
  ro.timeout = config_.comm.timeout();
  ro.pad_to = static_cast<std::size_t>(world_);
  ro.gradients = shard_gradients ? GradientHome::kShards : GradientHome::kBuckets;
  std::vector<at::Tensor> parameters;
  for (const auto& item : model.module().named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    parameters.push_back(item.value());
  }
  PARTRAIN_CHECK(!parameters.empty(), UsageError,
                 "train.shard: the model has no parameter to train");
  reducer_ = std::make_unique<Reducer>(parameters, *comm_, ro);
  if (gradient_scale() > 0) reducer_->set_scale(gradient_scale());

  const std::vector<BucketLayout>& layout = reducer_->layout();
  const std::vector<at::Tensor>& params = reducer_->parameters();
  const at::TensorOptions options = params.front().options().requires_grad(false);
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < layout.size(); ++b) {
    const BucketLayout& bucket = layout[b];
    at::Tensor flat = at::zeros({static_cast<std::int64_t>(bucket.elements)}, options);
    for (std::size_t i = 0; i < bucket.params.size(); ++i) {
      const at::Tensor& p = params[bucket.params[i]];
      const auto offset = static_cast<std::int64_t>(bucket.offsets[i]);
      flat.narrow(0, offset, p.numel()).copy_(p.reshape(-1));
      p.set_data(storage_view(flat, offset, p.sizes()));
    }
    const std::int64_t block = static_cast<std::int64_t>(bucket.elements) / world_;
    at::Tensor mine = storage_view(flat, rank_ * block, {block});
    if (shard_gradients) {
      gradient_shards_.push_back(at::zeros({block}, options));
      mine.mutable_grad() = gradient_shards_.back();
    } else {
      mine.mutable_grad() = storage_view(reducer_->bucket(b), rank_ * block, {block});
    }
    flat_parameters_.push_back(flat);
    blocks_.push_back(mine);
  }
  if (shard_gradients) {
    reduction_ = std::make_unique<ReduceScatterBucket>(*comm_, gradient_shards_);
    reducer_->use_reduction(*reduction_);
  }
  optimizer_ = ::partrain::make_optimizer(config_.train.optimizer, blocks_);
}

// The Reducer exists since make_optimizer(), which had to lay the parameters out in its buckets.
void ShardedDdpStrategy::start_gradient_averaging(TrainModel&) {}

double ShardedDdpStrategy::gradient_norm(const std::vector<at::Tensor>& gradients) {
  std::vector<at::Tensor> norms;
  for (const at::Tensor& g : gradients) norms.push_back(g.norm());
  at::Tensor squares = at::stack(norms).to(at::kDouble).pow(2).sum().reshape({1});
  allreduce_tensor(*comm_, squares, comm::ReduceOp::sum);
  return std::sqrt(squares.cpu().item<double>());
}

// In place: each block is this rank's part of the allgather's output.
void ShardedDdpStrategy::allgather_parameters() {
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    allgather_tensor(*comm_, blocks_[b], flat_parameters_[b]);
  }
}

bool ShardedDdpStrategy::step(const UpdateOptions& options, PrecisionPlugin& precision) {
  std::vector<at::Tensor> gradients;
  for (const at::Tensor& block : blocks_) gradients.push_back(block.grad());
  const bool finite = unscale_and_agree(precision, gradients);
  if (finite) {
    at::NoGradGuard no_grad;
    // As torch.nn.utils.clip_grad_norm_, over the gradients of every rank.
    if (options.clip_grad_norm > 0) {
      const double coefficient = options.clip_grad_norm / (gradient_norm(gradients) + 1e-6);
      if (coefficient < 1.0) {
        for (const at::Tensor& g : gradients) g.mul_(coefficient);
      }
    }
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(options.lr);
    optimizer_->step();
    allgather_parameters();
  }
  precision.update(finite);
  if (gradient_shards_.empty()) {
    reducer_->zero_grad();
  } else {
    for (const at::Tensor& g : gradient_shards_) g.zero_();
    reduction_->shards_zeroed();
  }
  return finite;
}

void ShardedDdpStrategy::save_state(StrategyState& out, bool writer) {
  const OptimizerName name = config_.train.optimizer.name;
  if (writer) {
    c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
    entry.insert("name", optimizer_name(name));
    entry.insert("shards", static_cast<std::int64_t>(world_));
    out.entries.emplace_back("optimizer", entry);
  }
  const std::vector<BucketLayout>& layout = reducer_->layout();
  const std::vector<at::Tensor>& params = reducer_->parameters();
  std::vector<ShardBlock> blocks;
  for (std::size_t b = 0; b < layout.size(); ++b) {
    ShardBlock block;
    for (std::size_t i = 0; i < layout[b].params.size(); ++i) {
      block.names.push_back(names_[layout[b].params[i]]);
      block.offsets.push_back(static_cast<std::int64_t>(layout[b].offsets[i]));
      block.numels.push_back(params[layout[b].params[i]].numel());
    }
    const std::int64_t length = blocks_[b].numel();
    block.begin = rank_ * length;
    block.end = block.begin + length;
    block.state = state_of(*optimizer_, name, blocks_[b]);
    for (auto& [key, t] : block.state.tensors) t = t.detach().cpu();
    blocks.push_back(std::move(block));
  }
  out.shard = shard_to_ivalue(rank_, world_, name, blocks);
}

// Whatever wrote the checkpoint (a sharded run of any world size, or an unsharded one), each
// piece of the state that falls into one of this rank's blocks is copied there.
void ShardedDdpStrategy::load_state(const SavedStrategyState& saved) {
  const SavedOptimizerState state = saved_optimizer(saved);
  const OptimizerName name = config_.train.optimizer.name;
  state.check_optimizer(name);
  optimizer_->state().clear();  // the zeros make_optimizer() made; see ReplicatedOptimizer::load
  const std::vector<BucketLayout>& layout = reducer_->layout();
  const std::vector<at::Tensor>& params = reducer_->parameters();
  StateAssembly assembly(saved.path);
  for (std::size_t b = 0; b < layout.size(); ++b) {
    const std::int64_t length = blocks_[b].numel();
    const std::int64_t begin = rank_ * length, end = begin + length;
    const std::size_t d = assembly.add_destination(length, blocks_[b].options().device(at::kCPU));
    for (std::size_t i = 0; i < layout[b].params.size(); ++i) {
      const auto offset = static_cast<std::int64_t>(layout[b].offsets[i]);
      const std::int64_t lo = std::max(begin, offset);
      const std::int64_t hi = std::min(end, offset + params[layout[b].params[i]].numel());
      assembly.add_region(names_[layout[b].params[i]], d, lo - begin, lo - offset, hi - offset);
    }
  }
  state.for_each_piece([&](const StatePiece& piece) { assembly.take(piece); });
  for (std::size_t b = 0; b < layout.size(); ++b) {
    set_state(*optimizer_, name, blocks_[b], assembly.result(b), saved.path);
  }
  allocate_state(*optimizer_, name);
}

StrategyMemory ShardedDdpStrategy::memory(const TrainModel& model) {
  StrategyMemory m = Strategy::memory(model);  // the flat parameters; .grad: buckets or none
  for (const at::Tensor& g : gradient_shards_) m.gradients += static_cast<std::int64_t>(g.nbytes());
  if (!gradient_shards_.empty()) {
    m.gradients_in_backward = reducer_->peak_bucket_bytes();
    m.gradients += m.gradients_in_backward;
  }
  m.optimizer_state = state_bytes(*optimizer_);
  m.communication = reduction_ ? reduction_->scratch_bytes() : 0;
  return m;
}

}  // namespace partrain
