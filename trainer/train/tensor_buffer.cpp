#include "trainer/train/tensor_buffer.h"

#include <ATen/ATen.h>

#include "comm_backends/communicator.h"

namespace partrain {
namespace {

bool reads_device_memory(const comm::Communicator& comm) { return comm.name() == "nccl"; }

// Runs `collective` on the tensor's memory, or on a host copy that is written back.
template <typename Collective>
void on_reachable_memory(comm::Communicator& comm, const at::Tensor& tensor,
                         Collective collective) {
  if (!tensor.is_cuda() || reads_device_memory(comm)) {
    collective(as_buffer(tensor));
    return;
  }
  at::Tensor host = tensor.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  collective(as_buffer(host));
  tensor.copy_(host);
}

}  // namespace

void allreduce_tensor(comm::Communicator& comm, const at::Tensor& tensor, comm::ReduceOp op) {
  on_reachable_memory(comm, tensor, [&](comm::Buffer b) { comm.allreduce(b, op); });
}

void broadcast_tensor(comm::Communicator& comm, const at::Tensor& tensor, int root) {
  on_reachable_memory(comm, tensor, [&](comm::Buffer b) { comm.broadcast(b, root); });
}

void allgather_tensor(comm::Communicator& comm, const at::Tensor& in, const at::Tensor& out) {
  if (!in.is_cuda() || reads_device_memory(comm)) {
    comm.allgather(as_buffer(in), as_buffer(out));
    return;
  }
  at::Tensor host_in = in.cpu(), host_out = out.cpu();
  comm.allgather(as_buffer(host_in), as_buffer(host_out));
  out.copy_(host_out);
}

}  // namespace partrain
