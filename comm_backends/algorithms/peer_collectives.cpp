#include "comm_backends/algorithms/peer_collectives.h"

#include <cstring>

#include "comm_backends/reduction.h"
#include "common/errors.h"

namespace partrain::comm {

PeerCollectives::PeerCollectives(PeerTransport& transport, const PeerCollectivesOptions& options)
    : transport_(transport), options_(options) {
  options_.chunk_bytes = std::max<std::size_t>(options_.chunk_bytes, 64);
}

void PeerCollectives::learn_hosts() {
  if (traffic_ || !options_.hosts) return;
  const HostLayout& layout = options_.hosts->layout();
  traffic_ = host_traffic(layout.host_of_each());
  traffic_->shared_cores = layout.shares_cores();
}

std::size_t PeerCollectives::pieces_for(Algorithm a, std::size_t bytes) {
  const bool exchanges = a == Algorithm::recursive_doubling || a == Algorithm::rabenseifner ||
                         a == Algorithm::recursive_halving;
  // The ring, or one piece either way.
  if (!exchanges || bytes <= options_.chunk_bytes) return options_.chunk_bytes;
  if (options_.whole_exchanges) return bytes;
  learn_hosts();
  return traffic_ && traffic_->shared_cores ? bytes : options_.chunk_bytes;
}

Algorithm PeerCollectives::algorithm_for(CollectiveKind kind, std::size_t bytes) {
  const bool by_hosts = choice_depends_on_hosts(kind, size(), options_.algorithm);
  if (by_hosts) learn_hosts();
  return choose_algorithm(kind, bytes, size(), options_.algorithm, options_.model,
                          options_.chunk_bytes, by_hosts && traffic_ ? &*traffic_ : nullptr);
}

CollectiveCall PeerCollectives::next_call(CollectiveKind kind, Algorithm algorithm) {
  CollectiveCall call;
  call.sequence = ++sequence_;
  call.kind = static_cast<std::uint8_t>(kind);
  call.algorithm = static_cast<std::uint8_t>(algorithm);
  last_ = algorithm;
  return call;
}

Reduction PeerCollectives::reduction(DType dtype, ReduceOp op, DType& wire) const {
  Reduction r;
  r.work = accumulator_type(dtype);
  if (r.work != DType::f32 || (wire != DType::f16 && wire != DType::bf16)) wire = r.work;
  r.wire = wire;
  r.op = op;
  r.divisor = op == ReduceOp::avg ? size() : 1;
  return r;
}

// The values in the work type: the caller's buffer when it is already that, else a copy.
std::uint8_t* PeerCollectives::work_copy(const void* data, std::size_t count, DType dtype,
                                         DType work) {
  work_.resize(std::max(work_.size(), count * dtype_size(work)));
  convert_elements(data, dtype, work_.data(), work, count);
  return work_.data();
}

void PeerCollectives::allreduce(void* data, std::size_t count, DType dtype, ReduceOp op,
                                DType wire) {
  reduce_all(CollectiveKind::allreduce, data, count, dtype, op, wire);
}

void PeerCollectives::reduce_all(CollectiveKind kind, void* data, std::size_t count, DType dtype,
                                 ReduceOp op, DType wire) {
  PARTRAIN_CHECK(count == 0 || data != nullptr, UsageError, "allreduce: null buffer");
  const Reduction r = reduction(dtype, op, wire);
  const bool moves = size() > 1 && count > 0;
  const Algorithm a = moves ? algorithm_for(kind, count * r.wire_elem()) : Algorithm::none;
  // Both may learn the hosts (a store exchange): before the call is counted.
  const std::size_t pieces = moves ? pieces_for(a, count * r.wire_elem()) : 0;
  CollectiveCall call = next_call(kind, a);
  call.elements = count;
  call.dtype = static_cast<std::uint8_t>(dtype);
  call.wire = static_cast<std::uint8_t>(wire);
  call.op = static_cast<std::uint8_t>(op);
  if (!moves) return;
  std::uint8_t* work =
      r.work == dtype ? static_cast<std::uint8_t*>(data) : work_copy(data, count, dtype, r.work);
  transport_.begin(call);
  switch (a) {
    case Algorithm::recursive_doubling:
      recursive_doubling_allreduce(transport_, r, work, count, pieces, scratch_);
      break;
    case Algorithm::rabenseifner:
      rabenseifner_allreduce(transport_, r, work, count, pieces, scratch_);
      break;
    default:
      ring_allreduce(transport_, r, work, count, options_.chunk_bytes, scratch_);
      break;
  }
  transport_.end();
  if (r.work != dtype) convert_elements(work, r.work, data, dtype, count);
}

void PeerCollectives::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                     ReduceOp op, DType wire) {
  PARTRAIN_CHECK(count == 0 || (in != nullptr && out != nullptr), UsageError,
                 "reduce_scatter: null buffer");
  const Reduction r = reduction(dtype, op, wire);
  const int world = size();
  const std::size_t total = count * static_cast<std::size_t>(world);
  const bool moves = world > 1 && count > 0;
  const Algorithm a = moves ? algorithm_for(CollectiveKind::reduce_scatter, total * r.wire_elem())
                            : Algorithm::none;
  const std::size_t pieces = moves ? pieces_for(a, total * r.wire_elem()) : 0;
  CollectiveCall call = next_call(CollectiveKind::reduce_scatter, a);
  call.elements = count;
  call.dtype = static_cast<std::uint8_t>(dtype);
  call.wire = static_cast<std::uint8_t>(wire);
  call.op = static_cast<std::uint8_t>(op);
  const std::size_t mine = count * static_cast<std::size_t>(rank());
  if (!moves) {
    if (count > 0) std::memmove(out, in, count * dtype_size(dtype));
    return;
  }
  // The algorithms reduce in place: they get a copy, so that `in` stays as it was.
  std::uint8_t* work = work_copy(in, total, dtype, r.work);
  const Bounds blocks = equal_bounds(total, world);
  transport_.begin(call);
  if (a == Algorithm::recursive_halving) {
    recursive_halving_reduce_scatter(transport_, r, work, blocks, pieces, scratch_);
  } else {
    ring_reduce_scatter(transport_, r, work, blocks, options_.chunk_bytes, scratch_);
  }
  transport_.end();
  convert_elements(work + mine * r.work_elem(), r.work, out, dtype, count);
}

void PeerCollectives::allgather(const void* in, void* out, std::size_t bytes_per_rank) {
  PARTRAIN_CHECK(bytes_per_rank == 0 || (in != nullptr && out != nullptr), UsageError,
                 "allgather: null buffer");
  const int world = size();
  const bool moves = world > 1 && bytes_per_rank > 0;
  const std::size_t total = bytes_per_rank * static_cast<std::size_t>(world);
  const Algorithm a = moves ? algorithm_for(CollectiveKind::allgather, total) : Algorithm::none;
  const std::size_t pieces = moves ? pieces_for(a, total) : 0;
  CollectiveCall call = next_call(CollectiveKind::allgather, a);
  call.bytes = bytes_per_rank;
  auto* target = static_cast<std::uint8_t*>(out);
  std::uint8_t* mine = target + rank() * bytes_per_rank;
  if (bytes_per_rank > 0 && mine != in) std::memmove(mine, in, bytes_per_rank);
  if (!moves) return;
  const Bounds blocks = scaled(equal_bounds(world, world), bytes_per_rank);
  transport_.begin(call);
  if (a == Algorithm::recursive_doubling) {
    recursive_doubling_allgather(transport_, target, blocks, pieces);
  } else {
    ring_allgather(transport_, target, blocks, options_.chunk_bytes);
  }
  transport_.end();
}

void PeerCollectives::broadcast(void* data, std::size_t bytes, int root) {
  PARTRAIN_CHECK(root >= 0 && root < size(), UsageError, "broadcast: root ", root,
                 " is outside a world of ", size());
  PARTRAIN_CHECK(bytes == 0 || data != nullptr, UsageError, "broadcast: null buffer");
  const bool moves = size() > 1 && bytes > 0;
  const Algorithm a = moves ? algorithm_for(CollectiveKind::broadcast, bytes) : Algorithm::none;
  CollectiveCall call = next_call(CollectiveKind::broadcast, a);
  call.bytes = bytes;
  call.root = root;
  if (!moves) return;
  transport_.begin(call);
  if (a == Algorithm::binomial_tree) {
    binomial_tree_broadcast(transport_, static_cast<std::uint8_t*>(data), bytes, root);
  } else {
    ring_broadcast(transport_, static_cast<std::uint8_t*>(data), bytes, root, options_.chunk_bytes);
  }
  transport_.end();
}

void PeerCollectives::barrier() {
  // An allreduce of one value: nobody leaves before every rank's contribution is in.
  std::int32_t token = 1;
  reduce_all(CollectiveKind::barrier, &token, 1, DType::i32, ReduceOp::sum, DType::i32);
  PARTRAIN_CHECK(token == size(), CommError, "barrier counted ", token, " ranks in a world of ",
                 size());
}

}  // namespace partrain::comm
