#include "comm_backends/collective_call.h"

namespace partrain::comm {
namespace {

const char* kind_name(std::uint8_t kind) {
  switch (static_cast<CollectiveKind>(kind)) {
    case CollectiveKind::allreduce:
      return "allreduce";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::allgather:
      return "allgather";
    case CollectiveKind::barrier:
      return "barrier";
  }
  return "an unknown collective";
}

}  // namespace

std::string CollectiveCall::describe() const {
  std::string text = std::string(kind_name(kind)) + " #" + std::to_string(sequence);
  if (static_cast<CollectiveKind>(kind) == CollectiveKind::barrier) return text;
  if (counts_elements()) {
    text += " of " + std::to_string(elements) + " " +
            std::string(dtype_name(static_cast<DType>(dtype))) + " (" +
            std::string(reduce_op_name(static_cast<ReduceOp>(op))) + ", wire " +
            std::string(dtype_name(static_cast<DType>(wire))) + ")";
  } else {
    text += " of " + std::to_string(bytes) + " bytes";
  }
  if (static_cast<CollectiveKind>(kind) == CollectiveKind::broadcast) {
    text += " from root " + std::to_string(root);
  }
  return text;
}

}  // namespace partrain::comm
