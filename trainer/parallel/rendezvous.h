// defines: RankGroup, meet_ranks() and join_rank_group() — the rendezvous of one rank with the
// others of its run: the group it opens (comm::RankGroup: store, address, hosts) and the
// communicators the collectives run on.
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
  comm::RankGroup* ranks = nullptr;  // meet_ranks()'s, held by the caller; null for single and dp
  std::unique_ptr<comm::Communicator> comm;
  // model.sync_batchnorm under ddp: the BatchNorm layers' own communicator, kept apart from
  // the Reducer's (Note [SyncBatchNorm]); null otherwise.
  std::unique_ptr<comm::Communicator> batchnorm_comm;
  std::chrono::milliseconds timeout{0};  // comm.timeout_s: the bound of every wait

  comm::Store* store() const { return ranks ? &ranks->store() : nullptr; }
};

// The ranks of a run meet: the group's store opened and every rank's config held against rank
// 0's (agree_on_config(), trainer/config/config_agreement.h). The first thing a rank does with
// the others, before anything that its config could make fail on it alone (a rank of another
// config would leave the others waiting out the timeout). Null for single and dp (one process);
// strategy ddp meets with one rank too (a store of its own, in memory, when no rendezvous is
// given).
std::unique_ptr<comm::RankGroup> meet_ranks(const Config& config, const RankPlace& place);

// The communicators of the group `ranks` (meet_ranks()'s): strategy ddp always gets one — with
// one rank too, so that a one-rank run exercises the backend it names; single and dp get none.
// Collectives on `device`'s memory. `ranks` must outlive the group: a rank that stops on an
// error of its own tells the others through its store while the communicators are still open
// (comm::RankGroup::tell_stopped()).
RankGroup join_rank_group(const Config& config, const c10::Device& device, comm::RankGroup* ranks);

}  // namespace partrain
