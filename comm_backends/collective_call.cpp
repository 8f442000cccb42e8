#include "comm_backends/collective_call.h"

namespace partrain::comm {

std::string_view collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce:
      return "allreduce";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::allgather:
      return "allgather";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
  }
  return "an unknown collective";
}

std::string_view algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::none:
      return "none";
    case Algorithm::ring:
      return "ring";
    case Algorithm::recursive_doubling:
      return "recursive_doubling";
    case Algorithm::rabenseifner:
      return "rabenseifner";
    case Algorithm::recursive_halving:
      return "recursive_halving";
    case Algorithm::binomial_tree:
      return "binomial_tree";
  }
  return "an unknown algorithm";
}

std::string CollectiveCall::describe() const {
  const auto what = static_cast<CollectiveKind>(kind);
  std::string text = std::string(collective_kind_name(what)) + " #" + std::to_string(sequence);
  if (what == CollectiveKind::barrier) return text;
  if (counts_elements()) {
    text += " of " + std::to_string(elements) + " " +
            std::string(dtype_name(static_cast<DType>(dtype))) +
            (what == CollectiveKind::reduce_scatter ? " per rank" : "") + " (" +
            std::string(reduce_op_name(static_cast<ReduceOp>(op))) + ", wire " +
            std::string(dtype_name(static_cast<DType>(wire))) + ")";
  } else {
    text += " of " + std::to_string(bytes) + " bytes";
    if (what == CollectiveKind::allgather) text += " per rank";
  }
  if (what == CollectiveKind::broadcast) text += " from root " + std::to_string(root);
  if (algorithm != 0)
    text += " by " + std::string(algorithm_name(static_cast<Algorithm>(algorithm)));
  return text;
}

}  // namespace partrain::comm
