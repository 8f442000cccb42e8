// defines: as_buffer() — a torch::Tensor seen as a comm::Buffer — and allreduce_tensor() /
// broadcast_tensor() / allgather_tensor() / reduce_scatter_tensor() / sum_over_ranks(), the one
// place the trainer crosses from tensors to the LibTorch-free communication layer.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "comm_backends/buffer.h"
#include "common/errors.h"

namespace partrain {

inline comm::DType to_comm_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return comm::DType::f32;
    case c10::ScalarType::Double:
      return comm::DType::f64;
    case c10::ScalarType::Half:
      return comm::DType::f16;
    case c10::ScalarType::BFloat16:
      return comm::DType::bf16;
    case c10::ScalarType::Int:
      return comm::DType::i32;
    case c10::ScalarType::Long:
      return comm::DType::i64;
    default:
      throw Error(std::string("no collective for tensors of type ") + c10::toString(type));
  }
}

// The tensor must be contiguous: collectives see flat memory. The CUDA stream is left at
// nullptr, the legacy default stream, which is where LibTorch computes unless told otherwise.
inline comm::Buffer as_buffer(const at::Tensor& t) {
  PARTRAIN_CHECK(t.is_contiguous(), Error, "collective on a non-contiguous tensor");
  comm::Buffer b;
  b.data = t.data_ptr();
  b.count = static_cast<std::size_t>(t.numel());
  b.dtype = to_comm_dtype(t.scalar_type());
  b.device = t.is_cuda() ? comm::DeviceKind::cuda : comm::DeviceKind::cpu;
  b.device_index = t.is_cuda() ? t.get_device() : 0;
  return b;
}

namespace comm {
class Communicator;
class CudaEvent;
class HostStaging;
}  // namespace comm

// True where the backend reads device memory itself (nccl); the others stage CUDA tensors
// through host memory.
bool collective_reads_device_memory(const comm::Communicator& comm);

// How a collective on a CUDA tensor meets the compute stream. Both empty (the default): the
// collective waits for everything queued on the compute stream so far, and the host
// backends stage through plain synchronous copies, which is right for occasional calls.
struct StreamOrder {
  // Recorded on the compute stream when the tensor was complete: the collective waits for
  // that point only, not for the work queued after it.
  const comm::CudaEvent* ready = nullptr;
  // For the host backends: pinned memory and a copy stream of their own (see HostStaging).
  comm::HostStaging* staging = nullptr;
};

// Collectives on a tensor. A CUDA tensor goes to the communicator as it is when the backend
// reads device memory (nccl); for the host backends (gloo, asio-ring) it is staged through
// a host copy: device -> host, collective, host -> device. Each returns once the result is
// in the tensor.
void allreduce_tensor(comm::Communicator& comm, const at::Tensor& tensor, comm::ReduceOp op,
                      const StreamOrder& order = {});
void broadcast_tensor(comm::Communicator& comm, const at::Tensor& tensor, int root,
                      const StreamOrder& order = {});
// out holds comm.size() * in.numel() elements, rank order.
void allgather_tensor(comm::Communicator& comm, const at::Tensor& in, const at::Tensor& out,
                      const StreamOrder& order = {});

// Block r of `in` reduced over the ranks into rank r's `out`: in.numel() == comm.size() *
// out.numel(), both contiguous and of one dtype (a sharded strategy pads its buckets to a
// multiple of the world size for this). `in` is left as it was.
void reduce_scatter_tensor(comm::Communicator& comm, const at::Tensor& in, const at::Tensor& out,
                           comm::ReduceOp op, const StreamOrder& order = {});

// Sums `values` over all ranks, in place, in f64. They travel as a tensor on `device`, because
// a backend such as nccl only reads device memory. Without a communicator, or with one rank,
// the values stay as they are.
void sum_over_ranks(comm::Communicator* comm, std::vector<double>& values,
                    const c10::Device& device);

}  // namespace partrain
