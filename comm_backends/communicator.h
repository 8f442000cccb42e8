// defines: Communicator (the collective contract), CommOptions, make_communicator(),
// communicator_key_prefix(), backend_names(), backend_compiled_in().
//
// Backends: gloo, asio-ring, shm, hierarchical, nccl, and auto — the first usable in the
// ordered list [nccl (CUDA buffers, Linux, compiled in), asio-ring] wins, and asio-ring
// becomes shm when every rank runs on one host (shm gives asio-ring's results, through
// memory) and hierarchical when the ranks span several hosts with more than one on some
// (shared memory inside each host, the ring among one leader per host).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/buffer.h"

namespace partrain::comm {

class Store;

struct CommOptions {
  std::string backend = "auto";  // gloo | asio-ring | shm | hierarchical | nccl | auto
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  DType wire_dtype = DType::f32;        // asio-ring, hierarchical (across hosts): f32 | f16 | bf16
  DeviceKind device = DeviceKind::cpu;  // where the caller's buffers live (for auto)
  int device_index = 0;
  std::string token;                    // run token for the ring handshake
  std::string bind_host = "127.0.0.1";  // address the ring listens on and advertises
  std::size_t ring_chunk_bytes = 0;     // asio-ring pipeline chunk; 0: the default
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  virtual void allreduce(Buffer buffer, ReduceOp op) = 0;  // in place
  virtual void broadcast(Buffer buffer, int root) = 0;
  // out.count must equal size() * in.count; result in rank order.
  virtual void allgather(const Buffer& in, Buffer out) = 0;
  virtual void barrier() = 0;
};

// The store must outlive the communicator: asio-ring also uses it, after a failure, to trace
// which rank failed first (the ranks downstream of a dead one see only their neighbour close).
// Throws UsageError for an unknown backend or one not compiled in (saying how to get it
// or what to use instead), CommError/PeerError when rendezvous fails.
std::unique_ptr<Communicator> make_communicator(const CommOptions& options, Store& store, int rank,
                                                int size);

// The store keys of the instance-th communicator made on a store (counted from 1, the same
// on every rank) start with this; its backend puts all of its own keys under it.
std::string communicator_key_prefix(std::int64_t instance, const std::string& backend);

std::vector<std::string> backend_names();  // every known name, compiled in or not
bool backend_compiled_in(const std::string& name);
// What auto picks from the options alone (make_communicator() then takes shm or hierarchical
// for asio-ring, by where the ranks run).
std::string resolve_backend(const CommOptions& options);

}  // namespace partrain::comm
