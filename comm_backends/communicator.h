// defines: Communicator (the collective contract), CommOptions, make_communicator(),
// communicator_key_prefix(), backend_names(), backend_compiled_in(), choose_backend() and
// BackendStatus / probe_backends().
//
// Every communicator make_communicator() returns is a backend's behind one CheckedCommunicator
// (checked_communicator.h): the lock, the buffer checks, the numbering and flight record of
// every call, and the naming of a failed rank are done there once, for every backend.
//
// Backends: nccl, shm, hierarchical, asio-ring, gloo, and auto. One list (communicator.cpp)
// holds them in the order `auto` tries them; the first compiled in and usable for the
// placement of the ranks (placement.h) wins. So auto takes nccl for CUDA buffers on Linux,
// shm when several ranks all run on one host (asio-ring's results, through memory),
// hierarchical when the ranks span several hosts with more than one on some (shared memory
// inside each host, the ring among one leader per host), and asio-ring otherwise. A backend named
// explicitly is that backend, or a UsageError saying why it cannot be.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm_backends/buffer.h"
#include "comm_backends/placement.h"

namespace partrain::comm {

class Store;

// The range of a timeout given in seconds (comm.timeout_s, the benches' --timeout-s): every
// wait it bounds ends within a week.
inline constexpr double kMinTimeoutSeconds = 0.1;
inline constexpr double kMaxTimeoutSeconds = 7 * 86400.0;
// What is wrong with a timeout of `seconds` given on a command line ("X is out of range (...)",
// NaN too), or "".
std::string timeout_seconds_problem(double seconds);

struct CommOptions {
  std::string backend = "auto";  // gloo | asio-ring | shm | hierarchical | nccl | auto
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  DType wire_dtype = DType::f32;  // asio-ring, shm, hierarchical (across hosts): f32 | f16 | bf16
  DeviceKind device = DeviceKind::cpu;  // where the caller's buffers live (for auto)
  int device_index = 0;
  std::string token;                    // run token for the ring handshake
  std::string bind_host = "127.0.0.1";  // address the ring listens on and advertises
  std::size_t ring_chunk_bytes = 0;     // asio-ring pipeline chunk; 0: the default
  // asio-ring and hierarchical (across hosts): auto | ring | recursive_doubling | rabenseifner
  // (algorithm_choice.h)
  std::string algorithm = "auto";
  // asio-ring and hierarchical (across hosts): auto | system | a kernel's name (cubic, reno,
  // bbr): each connection's TCP congestion control (tcp_congestion_problem()).
  std::string tcp_congestion = "auto";
  // shm and hierarchical (inside a host): a large allgather may read the other ranks' blocks
  // straight from their processes where the system allows it (ShmOptions::single_copy).
  bool shm_single_copy = true;
};

// What a backend can do, asked of it rather than told by its name.
struct Capabilities {
  bool host_memory = true;     // takes buffers in host memory
  bool device_memory = false;  // takes CUDA buffers and reduces them where they are
  // reduce_scatter moves only (W-1)/W of the input through each rank, instead of running
  // as an allreduce whose result is then cut.
  bool native_reduce_scatter = false;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  virtual Capabilities capabilities() const { return {}; }
  virtual void allreduce(Buffer buffer, ReduceOp op) = 0;  // in place
  // in.count must equal size() * out.count, and in and out not overlap: rank r receives in
  // `out` the reduction over all ranks of block r of `in` (elements [r * out.count,
  // (r + 1) * out.count)). `in` is not modified. This default, for host buffers, is an
  // allreduce of a copy; every backend has its own.
  virtual void reduce_scatter(const Buffer& in, Buffer out, ReduceOp op);
  virtual void broadcast(Buffer buffer, int root) = 0;
  // out.count must equal size() * in.count; result in rank order. `in` may be this rank's own
  // block of `out` (in place, as MPI_IN_PLACE and NCCL allow), and must not overlap `out`
  // otherwise.
  virtual void allgather(const Buffer& in, Buffer out) = 0;
  virtual void barrier() = 0;
  // How the last collective moved its data ("ring", "recursive_doubling", "shm", ...).
  virtual std::string last_algorithm() const { return name(); }
};

// The store must outlive the communicator: asio-ring also uses it, after a failure, to trace
// which rank failed first (the ranks downstream of a dead one see only their neighbour close).
// Where the ranks run is learned through the store when the backend asks (placement.h).
// Throws UsageError for an unknown backend or one not compiled in (saying how to get it
// or what to use instead), CommError/PeerError when rendezvous fails.
std::unique_ptr<Communicator> make_communicator(const CommOptions& options, Store& store, int rank,
                                                int size);
// The same, with the hosts of the ranks shared: a RankGroup (rank_group.h) learns them at
// most once for all its communicators. The world size is hosts.ranks().
std::unique_ptr<Communicator> make_communicator(const CommOptions& options, Store& store,
                                                const RankHosts& hosts, int rank);

// The store keys of the instance-th communicator made on a store (counted from 1, the same
// on every rank) start with this; its backend puts all of its own keys under it.
std::string communicator_key_prefix(std::int64_t instance, const std::string& backend);

std::vector<std::string> backend_names();  // every known name, compiled in or not, and auto
// What is wrong with how a CommOptions::tcp_congestion is written, or "": auto (cubic, else
// reno, where both ends of a connection run on one machine; the system's between machines:
// Note [Congestion control on one machine] in net/timed_io.cpp), system, or a plain name
// (Linux only), which the ranks' kernel must have and permit when they connect.
std::string tcp_congestion_problem(const std::string& request);
// In words, what comm.tcp_congestion auto does on this machine: "system default bbr; auto:
// cubic between ranks of one machine, bbr between machines".
std::string describe_tcp_congestion();
bool backend_compiled_in(const std::string& name);
// The backend that `requested` stands for with ranks placed so: itself, or for auto the
// first usable one. UsageError for an unknown name.
std::string choose_backend(const std::string& requested, const Placement& placement);

// One backend's answer for a placement.
struct BackendStatus {
  std::string name;
  bool compiled_in = false;
  // Why `auto` may not take it there ("" when it may); for a backend not compiled in, how to
  // get it or what to use instead.
  std::string why_not;
};
// Every backend, in the order `auto` tries them.
std::vector<BackendStatus> probe_backends(const Placement& placement);

}  // namespace partrain::comm
