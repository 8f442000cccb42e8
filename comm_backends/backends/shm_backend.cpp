// The shm backend: ShmCollectives over a region of shared memory (ShmRegion), for ranks that
// all run on one host.
//
// Setup through the store: every rank publishes its host identity and checks that all are
// the same; then the region is made and mapped (shm_region.h).
#include <memory>
#include <mutex>

#include "comm_backends/backends/backend.h"
#include "comm_backends/shm/host_identity.h"
#include "comm_backends/shm/shm_collectives.h"
#include "comm_backends/shm/shm_region.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {
namespace {

// Every rank on this rank's host, or a UsageError naming one that is not.
void check_one_host(Store& store, const std::string& prefix, int rank, int size) {
  const auto other = rank_on_another_host(store, prefix + "host/", rank, size);
  PARTRAIN_CHECK(!other, UsageError, "comm backend 'shm' needs every rank on one host, but rank ",
                 other->rank, " runs on '", other->identity, "' and rank ", rank, " on '",
                 host_identity(), "'; use asio-ring, hierarchical or gloo across hosts");
}

class ShmCommunicator : public Communicator {
 public:
  ShmCommunicator(const CommOptions& options, Store& store, int rank, int size,
                  const std::string& prefix)
      : wire_(options.wire_dtype) {
    check_one_host(store, prefix, rank, size);
    region_ = std::make_unique<ShmRegion>(
        store, prefix, options.token, rank, size, shm_region_bytes(size), options.timeout,
        [&](void* address) {
          collectives_ = std::make_unique<ShmCollectives>(address, rank, size, options.timeout);
        });
  }

  int rank() const override { return collectives_->rank(); }
  int size() const override { return collectives_->size(); }
  std::string name() const override { return "shm"; }

  void allreduce(Buffer buffer, ReduceOp op) override {
    check_host_buffer(buffer, name());
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_);
  }

  void broadcast(Buffer buffer, int root) override {
    check_host_buffer(buffer, name());
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->broadcast(buffer.data, buffer.bytes(), root);
  }

  void allgather(const Buffer& in, Buffer out) override {
    check_host_buffer(in, name());
    check_host_buffer(out, name());
    check_allgather_buffers(in, out, size());
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->allgather(in.data, out.data, in.bytes());
  }

  void barrier() override {
    std::lock_guard<std::mutex> lock(mutex_);
    collectives_->barrier();
  }

 private:
  DType wire_;
  std::unique_ptr<ShmRegion> region_;
  std::unique_ptr<ShmCollectives> collectives_;
  std::mutex mutex_;  // one collective at a time, as on the other backends
};

}  // namespace

Backend shm_backend() {
  Backend backend;
  backend.name = "shm";
  backend.compiled_in = true;
  // Not in auto's walk over the options: make_communicator() swaps asio-ring for shm once the
  // store shows every rank on one host, which the options alone cannot tell.
  backend.usable = [](const CommOptions&) { return false; };
  backend.make = [](const CommOptions& options, Store& store, int rank, int size,
                    const std::string& prefix) -> std::unique_ptr<Communicator> {
    return std::make_unique<ShmCommunicator>(options, store, rank, size, prefix);
  };
  return backend;
}

}  // namespace partrain::comm
