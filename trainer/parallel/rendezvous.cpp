#include "trainer/parallel/rendezvous.h"

#include <cstdint>
#include <memory>

#include "common/errors.h"
#include "trainer/config/config_agreement.h"

namespace partrain {

std::unique_ptr<comm::RankGroup> meet_ranks(const Config& cfg, const RankPlace& env) {
  std::unique_ptr<comm::RankGroup> ranks;
  try {
    PARTRAIN_CHECK(env.world_size == 1 || cfg.strategy == StrategyKind::kDdp, UsageError,
                   "strategy ", name_of(cfg.strategy), " runs in one process, but the launch has ",
                   env.world_size, " ranks; use strategy: ddp");
    if (cfg.strategy != StrategyKind::kDdp) return nullptr;
    PARTRAIN_CHECK(!env.rendezvous.empty() || env.world_size == 1, UsageError,
                   "no rendezvous: set launch.rendezvous or start ranks with partrain run");
    comm::RankGroupOptions options;
    static_cast<RankPlace&>(options) = env;
    options.timeout = cfg.comm.timeout();
    options.host = cfg.comm.host;
    options.interface = cfg.comm.interface;
    ranks = comm::open_rank_group(options);
  } catch (const comm::MasterStoppedError&) {
    throw;  // the master stood in for a store it could not start: nobody to tell
  } catch (const UsageError& e) {
    // A setting this rank alone refuses (another strategy, an address its host cannot choose):
    // the others hear of it now rather than at their timeout. A store that could not be
    // reached is a CommError, and not told through that store.
    tell_ranks_this_one_stopped(env, e.what(), cfg.comm.timeout());
    throw;
  }
  if (env.world_size > 1) {
    agree_on_config(ranks->store(), agreement_json(cfg), env.rank, env.world_size,
                    cfg.comm.timeout());
  }
  return ranks;
}

RankGroup join_rank_group(const Config& cfg, const c10::Device& device, comm::RankGroup* ranks) {
  RankGroup group;
  group.timeout = cfg.comm.timeout();
  if (ranks == nullptr) return group;
  group.ranks = ranks;
  comm::CommOptions co = group.ranks->comm_options();
  co.backend = cfg.comm.backend;
  co.wire_dtype = cfg.comm.wire_dtype;
  co.algorithm = cfg.comm.algorithm;
  co.tcp_congestion = cfg.comm.tcp_congestion;
  co.shm_single_copy = cfg.comm.shm_single_copy;
  co.device = device.is_cuda() ? comm::DeviceKind::cuda : comm::DeviceKind::cpu;
  co.device_index = device.is_cuda() ? device.index() : 0;
  group.comm = group.ranks->make_communicator(co);
  if (cfg.model.sync_batchnorm) group.batchnorm_comm = group.ranks->make_communicator(co);
  return group;
}

}  // namespace partrain
