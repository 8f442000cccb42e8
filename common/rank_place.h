// defines: RankPlace — where one rank stands in its run (its rank, the world, the ranks on its
// host, the rendezvous and the run token), as an engine's environment gives it and as the
// worker, the bench and open_rank_group() pass it on: one struct, so no layer copies its
// fields one by one.
#pragma once

#include <string>

namespace partrain {

struct RankPlace {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;  // ranks on this host, as the launcher or engine counts them
  int restart = 0;           // how many times the launcher or engine restarted the group
  std::string rendezvous;    // store url (comm_backends/store/store.h); "" when none is named
  std::string token;         // run token shared by every rank, fresh per restart
};

}  // namespace partrain
