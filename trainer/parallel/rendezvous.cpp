#include "trainer/parallel/rendezvous.h"

#include <cstdlib>
#include <string>

#include "comm_backends/net/local_address.h"
#include "common/errors.h"

namespace partrain {
namespace {

// The rendezvous master's host: the tcp store's, else MASTER_ADDR (a file store shared by
// ranks that torchrun started), else none.
std::string master_host(const std::string& rendezvous) {
  if (rendezvous.rfind("tcp://", 0) == 0 || rendezvous.rfind("env://", 0) == 0) {
    return comm::parse_store_url(rendezvous).host;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  return addr != nullptr ? addr : "";
}

}  // namespace

RankGroup join_rank_group(const Config& cfg, const WorkerEnv& env, const c10::Device& device) {
  RankGroup group;
  group.timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.comm.timeout_s * 1000));
  PARTRAIN_CHECK(env.world_size == 1 || cfg.strategy == StrategyKind::kDdp, UsageError, "strategy ",
                 name_of(cfg.strategy), " runs in one process, but the launch has ", env.world_size,
                 " ranks; use strategy: ddp");
  if (cfg.strategy != StrategyKind::kDdp) return group;

  std::string rendezvous = env.rendezvous;
  if (rendezvous.empty() && env.world_size == 1) {
    group.own_rendezvous = std::make_unique<TempDir>("partrain-rdzv");
    rendezvous = "file://" + group.own_rendezvous->path().generic_string();
  }
  PARTRAIN_CHECK(!rendezvous.empty(), UsageError,
                 "no rendezvous: set launch.rendezvous or start ranks with partrain run");
  // The address this rank listens on and publishes: one the other hosts can reach.
  comm::net::BindAddressRequest address;
  address.host = cfg.comm.host;
  address.interface = cfg.comm.interface;
  address.master_host = master_host(rendezvous);
  address.single_host = env.local_world_size >= env.world_size;
  const std::string bind_host = comm::net::choose_bind_address(address);
  comm::StoreOptions so;
  so.token = env.token;
  so.timeout = group.timeout;
  so.rank = env.rank;
  so.world_size = env.world_size;
  so.host_server = env.rank == 0;
  group.store = comm::open_store(rendezvous, so);
  comm::CommOptions co;
  co.backend = cfg.comm.backend;
  co.timeout = group.timeout;
  co.wire_dtype = cfg.comm.wire_dtype;
  co.device = device.is_cuda() ? comm::DeviceKind::cuda : comm::DeviceKind::cpu;
  co.device_index = device.is_cuda() ? device.index() : 0;
  co.token = env.token;
  co.bind_host = bind_host;
  group.comm = comm::make_communicator(co, *group.store, env.rank, env.world_size);
  if (cfg.model.sync_batchnorm) {
    group.batchnorm_comm = comm::make_communicator(co, *group.store, env.rank, env.world_size);
  }
  return group;
}

}  // namespace partrain
