// defines: CheckedCommunicator — what make_communicator() hands out: a backend's communicator
// behind what every backend would otherwise repeat (c10d's ProcessGroupWrapper does the same
// for PyTorch's): one collective at a time (a lock: the backends' byte streams and shared
// regions carry calls in order), the buffers checked against what the backend can take
// (Capabilities), every call numbered and kept in the flight recorder (flight_recorder.h),
// and after a failure the rank that caused it named (failure_trace.h) and the communicator
// refused from then on.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "comm_backends/collective_call.h"
#include "comm_backends/communicator.h"

namespace partrain {
class PeerError;
}

namespace partrain::comm {

class Store;

class CheckedCommunicator final : public Communicator {
 public:
  // `instance` numbers the communicator on every rank alike (communicator_key_prefix()); the
  // failure trace keeps its keys under `prefix` + "trace/". The store must outlive this.
  CheckedCommunicator(std::unique_ptr<Communicator> backend, Store& store, std::string prefix,
                      std::int64_t instance, std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  Capabilities capabilities() const override { return capabilities_; }
  void allreduce(Buffer buffer, ReduceOp op) override;
  void reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) override;
  void broadcast(Buffer buffer, int root) override;
  void allgather(const Buffer& in, Buffer out) override;
  void barrier() override;
  std::string last_algorithm() const override;

  std::int64_t instance() const { return instance_; }
  std::uint64_t calls() const;  // collectives called so far: the last one's number

 private:
  template <typename Collective>
  void run(CollectiveKind kind, std::size_t bytes, Collective&& collective);
  void check_buffer(const Buffer& buffer, const char* what) const;
  [[noreturn]] void trace_and_rethrow(const PeerError& lost);

  std::unique_ptr<Communicator> backend_;
  Store& store_;
  const std::string prefix_;
  const std::int64_t instance_;
  const std::chrono::milliseconds timeout_;
  const int rank_, size_;
  const std::string name_;
  const Capabilities capabilities_;
  mutable std::mutex mutex_;
  std::uint64_t calls_ = 0;
  std::string last_algorithm_;
  std::string failure_;  // what broke it; empty while it works
};

}  // namespace partrain::comm
