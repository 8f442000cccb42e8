// defines: RankGroup and join_rank_group() — the rendezvous of one rank with the others of
// its run: the group it opens (comm::RankGroup: store, address, hosts) and the communicators
// the collectives run on.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>

#include "comm_backends/communicator.h"
#include "comm_backends/rank_group.h"
#include "common/rank_place.h"
#include "trainer/config/config.h"

namespace partrain {

struct RankGroup {
  std::unique_ptr<comm::RankGroup> ranks;  // null for single and dp
  std::unique_ptr<comm::Communicator> comm;
  // model.sync_batchnorm under ddp: the BatchNorm layers' own communicator, kept apart from
  // the Reducer's (Note [SyncBatchNorm]); null otherwise.
  std::unique_ptr<comm::Communicator> batchnorm_comm;
  std::chrono::milliseconds timeout{0};  // comm.timeout_s: the bound of every wait

  comm::Store* store() const { return ranks ? &ranks->store() : nullptr; }
};

// strategy ddp always gets a communicator — with one rank too, so that a one-rank run
// exercises the backend it names (and a rendezvous of its own, in a temporary directory,
// when none is given); single and dp get none. Collectives on `device`'s memory.
RankGroup join_rank_group(const Config& config, const RankPlace& place, const c10::Device& device);

}  // namespace partrain
