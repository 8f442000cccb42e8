// defines: RankGroupOptions, RankGroup and open_rank_group() — one rank joining the others of
// its run: the store they meet through, the address its backends listen on, where every rank
// runs (learned once, when first needed), and the communicators made over them. `partrain worker`
// and `partrain bench allreduce` both open their ranks this way.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm_backends/communicator.h"
#include "comm_backends/placement.h"
#include "comm_backends/store/store.h"
#include "common/rank_place.h"

namespace partrain::comm {

// The rendezvous (a store url) may be empty with one rank: a store of its own, in memory
// (store/memory_store.h); empty with more is a UsageError (the callers say where a url comes
// from). Stores and rings refuse a peer without the run token.
struct RankGroupOptions : RankPlace {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // bound on every wait
  // The address to listen on and publish (net/local_address.h): comm.host, comm.interface.
  std::string host;
  std::string interface;
};

class RankGroup;

// The most a rank that stops waits on each request that says why (RankGroup::tell_stopped()).
inline constexpr std::chrono::milliseconds kTellStoppedBound{2000};

// Chooses the address (before any waiting: a bad setting fails at once) and opens the store
// (rank 0 serves a tcp one).
std::unique_ptr<RankGroup> open_rank_group(const RankGroupOptions& options);

class RankGroup {
 public:
  int rank() const { return rank_; }
  int size() const { return hosts_->ranks(); }
  Store& store() { return *store_; }
  const std::string& bind_host() const { return bind_host_; }
  const HostLayout& layout() const { return hosts_->layout(); }  // may wait: RankHosts

  // The group's token, address and timeout; the caller sets the backend, wire and device.
  CommOptions comm_options() const;
  // Every rank makes the group's communicators in the same order.
  std::unique_ptr<Communicator> make_communicator(const CommOptions& options);

  // This rank stops on an error of its own after the ranks met (its device, its data, its
  // model, its disk): it says why, "rank R (HOST) stopped: WHY" (the first line of `why`), under
  // rank_stopped_key() and, where it took no part in the host-layout exchange yet, in place of
  // its values there (stop_host_layout()). A rank that names it after a collective fails then
  // gives that reason, and one waiting for it in the exchange stops at once with it. Call it
  // before the communicators close: the others find the rank gone once they do. Never throws
  // (the store may be gone); no request waits longer than kTellStoppedBound.
  void tell_stopped(const std::string& why);
  // tell_stopped() from a thread beside the one that uses the store (a stop signal in the
  // start-up, StopRequest::tell_on_start_up_stop()): the same keys, with the store's bound left
  // alone, since that thread's requests read it; the caller bounds the wait.
  void tell_stopped_aside(const std::string& why);

 private:
  friend std::unique_ptr<RankGroup> open_rank_group(const RankGroupOptions& options);
  RankGroup() = default;
  void write_stopped(const std::string& why);

  int rank_ = 0;
  std::string token_;
  std::chrono::milliseconds timeout_{0};
  std::string bind_host_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RankHosts> hosts_;  // learned when a communicator first needs them
};

}  // namespace partrain::comm
