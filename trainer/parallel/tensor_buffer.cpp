#include "trainer/parallel/tensor_buffer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#include "comm_backends/communicator.h"
#include "comm_backends/cuda_stream.h"

namespace partrain {

bool collective_reads_device_memory(const comm::Communicator& comm) {
  return comm.capabilities().device_memory;
}

namespace {

comm::Buffer device_buffer(const at::Tensor& tensor, const StreamOrder& order) {
  comm::Buffer b = as_buffer(tensor);
  if (order.ready != nullptr) b.ready_event = order.ready->handle();
  return b;
}

// Runs `collective` on the tensor's memory, or on a host copy that is written back.
template <typename Collective>
void on_reachable_memory(comm::Communicator& comm, const at::Tensor& tensor,
                         const StreamOrder& order, const char* what, Collective collective) {
  if (!tensor.is_cuda() || collective_reads_device_memory(comm)) {
    collective(device_buffer(tensor, order));
    return;
  }
  if (order.staging != nullptr) {
    const comm::Buffer device = device_buffer(tensor, order);
    comm::Buffer host = order.staging->to_host(device, 0, order.ready, what);
    collective(host);
    order.staging->to_device(host, device, what);
    return;
  }
  // The plain path: both copies run on the compute stream, so each waits for all the work
  // queued there and holds the host until done.
  at::Tensor host = tensor.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  collective(as_buffer(host));
  tensor.copy_(host);
}

// The same for a collective from `in` into another tensor `out`: on a host copy of each, the
// result copied back into `out`.
template <typename Collective>
void on_reachable_memory(comm::Communicator& comm, const at::Tensor& in, const at::Tensor& out,
                         const StreamOrder& order, const char* in_what, const char* out_what,
                         Collective collective) {
  if (!in.is_cuda() || collective_reads_device_memory(comm)) {
    collective(device_buffer(in, order), as_buffer(out));
    return;
  }
  if (order.staging != nullptr) {
    const comm::Buffer device_out = as_buffer(out);
    comm::Buffer host_in =
        order.staging->to_host(device_buffer(in, order), 0, order.ready, in_what);
    comm::Buffer host_out = order.staging->host_buffer(device_out, 1);
    collective(host_in, host_out);
    order.staging->to_device(host_out, device_out, out_what);
    return;
  }
  at::Tensor host_in = in.cpu(), host_out = out.cpu();
  collective(as_buffer(host_in), as_buffer(host_out));
  out.copy_(host_out);
}

}  // namespace

void allreduce_tensor(comm::Communicator& comm, const at::Tensor& tensor, comm::ReduceOp op,
                      const StreamOrder& order) {
  on_reachable_memory(comm, tensor, order, "an allreduce buffer",
                      [&](comm::Buffer b) { comm.allreduce(b, op); });
}

void broadcast_tensor(comm::Communicator& comm, const at::Tensor& tensor, int root,
                      const StreamOrder& order) {
  on_reachable_memory(comm, tensor, order, "a broadcast buffer",
                      [&](comm::Buffer b) { comm.broadcast(b, root); });
}

void allgather_tensor(comm::Communicator& comm, const at::Tensor& in, const at::Tensor& out,
                      const StreamOrder& order) {
  on_reachable_memory(comm, in, out, order, "an allgather input", "an allgather output",
                      [&](const comm::Buffer& i, comm::Buffer o) { comm.allgather(i, o); });
}

// A reduce-scatter moves (W-1)/W of `in` through each rank, half an allreduce's traffic; on
// the host backends a CUDA `in` travels through a host copy, as allgather's does.
void reduce_scatter_tensor(comm::Communicator& comm, const at::Tensor& in, const at::Tensor& out,
                           comm::ReduceOp op, const StreamOrder& order) {
  const std::int64_t world = comm.size();
  PARTRAIN_CHECK(in.numel() == world * out.numel() && in.scalar_type() == out.scalar_type(), Error,
                 "reduce_scatter_tensor: ", in.numel(), " elements in, ", out.numel(),
                 " out, over ", world, " ranks");
  on_reachable_memory(
      comm, in, out, order, "a reduce-scatter input", "a reduce-scatter output",
      [&](const comm::Buffer& i, comm::Buffer o) { comm.reduce_scatter(i, o, op); });
}

void sum_over_ranks(comm::Communicator* comm, std::vector<double>& values,
                    const c10::Device& device) {
  if (comm == nullptr || comm->size() == 1 || values.empty()) return;
  at::Tensor t = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(device);
  allreduce_tensor(*comm, t, comm::ReduceOp::sum);
  t = t.cpu();
  std::copy(t.data_ptr<double>(), t.data_ptr<double>() + values.size(), values.begin());
}

}  // namespace partrain
