#include "comm_backends/rank_group.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "comm_backends/backends/failure_trace.h"
#include "comm_backends/backends/peer_process.h"
#include "comm_backends/net/local_address.h"
#include "comm_backends/store/memory_store.h"
#include "common/errors.h"
#include "common/host_name.h"
#include "common/worker_lines.h"

namespace partrain::comm {

namespace {

// The rendezvous master's host: the tcp store's (env:// included), else MASTER_ADDR (a file
// store shared by ranks that torchrun or mpirun started), else none.
std::string master_host(const std::string& rendezvous) {
  if (!rendezvous.empty()) {
    const StoreUrl url = parse_store_url(rendezvous);
    if (url.kind == StoreUrl::Kind::tcp) return url.host;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  return addr != nullptr ? addr : "";
}

}  // namespace

std::unique_ptr<RankGroup> open_rank_group(const RankGroupOptions& options) {
  std::unique_ptr<RankGroup> group(new RankGroup);
  const std::string& rendezvous = options.rendezvous;
  // Without one, a lone rank keeps its store in memory: it has nobody to meet.
  PARTRAIN_CHECK(!rendezvous.empty() || options.world_size == 1, UsageError, "no rendezvous for ",
                 options.world_size, " ranks");
  group->rank_ = options.rank;
  group->token_ = options.token;
  group->timeout_ = options.timeout;
  // The address this rank listens on and publishes: one the other hosts can reach.
  net::BindAddressRequest address;
  address.host = options.host;
  address.interface = options.interface;
  address.master_host = master_host(rendezvous);
  address.single_host = options.local_world_size >= options.world_size;
  group->bind_host_ = net::choose_bind_address(address);
  StoreOptions store;
  store.token = options.token;
  store.timeout = options.timeout;
  store.rank = options.rank;
  store.world_size = options.world_size;
  store.host_server = options.rank == 0;
  // So that a rank that loses this one can look at its process, where they share a machine.
  if (options.world_size > 1) publish_process_on_join(store, options.rank);
  group->store_ =
      rendezvous.empty() ? std::make_unique<MemoryStore>(store) : open_store(rendezvous, store);
  group->hosts_ = std::make_unique<RankHosts>(*group->store_, kHostLayoutPrefix, options.rank,
                                              options.world_size);
  return group;
}

CommOptions RankGroup::comm_options() const {
  CommOptions options;
  options.timeout = timeout_;
  options.token = token_;
  options.bind_host = bind_host_;
  return options;
}

std::unique_ptr<Communicator> RankGroup::make_communicator(const CommOptions& options) {
  return comm::make_communicator(options, *store_, *hosts_, rank_);
}

void RankGroup::tell_stopped(const std::string& why) {
  const ScopedStoreTimeout bound(*store_, std::min(store_->timeout(), kTellStoppedBound));
  write_stopped(why);
}

void RankGroup::tell_stopped_aside(const std::string& why) { write_stopped(why); }

void RankGroup::write_stopped(const std::string& why) {
  if (hosts_->ranks() == 1) return;  // nobody to tell
  const std::string sentence = format_rank_stopped(rank_, this_host_name(), reason_of(why));
  try {
    store_->set(rank_stopped_key(rank_),
                std::vector<std::uint8_t>(sentence.begin(), sentence.end()));
    stop_host_layout(*store_, kHostLayoutPrefix, rank_, hosts_->ranks(), sentence);
  } catch (const std::exception&) {
    // The store is gone (rank 0 served it): the others learn of that from the store.
  }
}

}  // namespace partrain::comm
