// defines: as_buffer() — a torch::Tensor seen as a comm::Buffer — and allreduce_tensor() /
// broadcast_tensor(), the one place the trainer crosses from tensors to the LibTorch-free
// communication layer.
#pragma once

#include <ATen/Tensor.h>

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
// the default (nullptr), which is the stream LibTorch itself uses unless told otherwise.
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
}

// Collectives on a tensor. A CUDA tensor goes to the communicator as it is when the backend
// reads device memory (nccl); for the host backends (gloo, asio-ring) it is staged through
// a host copy: device -> host, collective, host -> device.
void allreduce_tensor(comm::Communicator& comm, const at::Tensor& tensor, comm::ReduceOp op);
void broadcast_tensor(comm::Communicator& comm, const at::Tensor& tensor, int root);
// out holds comm.size() * in.numel() elements, rank order.
void allgather_tensor(comm::Communicator& comm, const at::Tensor& in, const at::Tensor& out);

}  // namespace partrain
