// The shm backend: ShmCollectives over a region of shared memory (ShmRegion), for ranks that
// all run on one host.
//
// Setup: the placement (learned once for the group) must show every rank on this host; then
// the region is made and mapped through the store (shm_region.h).
#include <memory>
#include <optional>
#include <string>

#include "comm_backends/backends/backend.h"
#include "comm_backends/shm/shm_collectives.h"
#include "comm_backends/shm/shm_region.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {
namespace {

// Nothing when every rank runs on one host; else why `auto` leaves shm alone.
std::optional<std::string> usable(const Placement& placement) {
  if (placement.hosts.ranks() < 2) return "one rank (nothing to share)";
  const std::size_t hosts = placement.hosts.layout().host_count();
  if (hosts > 1) {
    return "ranks on " + std::to_string(hosts) +
           " hosts (shared memory joins the ranks of one host)";
  }
  return shm_region_misfit(placement.hosts.ranks(), placement.hosts.layout().shm_room_of(0));
}

// Every rank on this rank's host, or a UsageError naming one that is not.
void check_one_host(const HostLayout& layout, int rank) {
  const int mine = layout.host_of(rank);
  for (const HostLayout::Run& run : layout.runs) {
    PARTRAIN_CHECK(run.host == mine, UsageError,
                   "comm backend 'shm' needs every rank on one host, but rank ", run.first,
                   " runs on '", layout.identities[static_cast<std::size_t>(run.host)],
                   "' and rank ", rank, " on '", layout.identities[static_cast<std::size_t>(mine)],
                   "'; use asio-ring, hierarchical or gloo across hosts");
  }
}

class ShmCommunicator : public Communicator {
 public:
  explicit ShmCommunicator(const BackendArgs& args) : wire_(args.options.wire_dtype) {
    const HostLayout& layout = args.placement.hosts.layout();
    check_one_host(layout, args.rank);
    const int size = args.size();
    ShmOptions shm;
    shm.timeout = args.options.timeout;
    shm.shared_cores = layout.shares_cores(layout.host_of(args.rank));
    shm.single_copy = args.options.shm_single_copy;
    region_ = std::make_unique<ShmRegion>(
        args.store, args.prefix, args.options.token, args.rank, size, shm_region_bytes(size),
        args.options.timeout, [&](void* address) {
          collectives_ = std::make_unique<ShmCollectives>(address, args.rank, size, shm);
        });
  }

  int rank() const override { return collectives_->rank(); }
  int size() const override { return collectives_->size(); }
  std::string name() const override { return "shm"; }
  Capabilities capabilities() const override {
    return {.host_memory = true, .device_memory = false, .native_reduce_scatter = true};
  }
  std::string last_algorithm() const override {
    return collectives_->last_was_single_copy() ? "single_copy" : "shared_memory";
  }

  void allreduce(Buffer buffer, ReduceOp op) override {
    collectives_->allreduce(buffer.data, buffer.count, buffer.dtype, op, wire_);
  }
  void reduce_scatter(const Buffer& in, Buffer out, ReduceOp op) override {
    collectives_->reduce_scatter(in.data, out.data, out.count, in.dtype, op, wire_);
  }
  void broadcast(Buffer buffer, int root) override {
    collectives_->broadcast(buffer.data, buffer.bytes(), root);
  }
  void allgather(const Buffer& in, Buffer out) override {
    collectives_->allgather(in.data, out.data, in.bytes());
  }
  void barrier() override { collectives_->barrier(); }

 private:
  DType wire_;
  std::unique_ptr<ShmRegion> region_;
  std::unique_ptr<ShmCollectives> collectives_;
};

}  // namespace

constinit const BackendEntry kShmBackend{"shm", true, "", usable, make_backend<ShmCommunicator>};

}  // namespace partrain::comm
