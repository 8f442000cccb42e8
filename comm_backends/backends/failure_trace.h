// defines: trace_failed_rank() — which rank a failed collective lost, found through the
// store, for backends whose own error names a neighbour, an address or nobody.
//
// A rank that fails reports "I failed, I blame P" (P = -1: I cannot tell whom) under
// PREFIX/failed/RANK, then follows the chain of such reports (P's own report blames someone
// further along) to a rank that published none within a short grace period: that one died
// or froze. With no one to start from (or a chain that ends in "cannot tell"), the ranks
// that send no report are the lost ones; survivors stuck on a lost rank report once their
// own wait times out, so that wait may last up to `patience` (the collective timeout) plus
// the grace period.
// Stall inspection of this kind is how Horovod names the ranks that are missing.
//
// A rank that stopped on an error of its own (its data, its model, its disk) says why under
// rank_stopped_key() before its communicators close (RankGroup::tell_stopped()), so the rank
// that names it can give its reason too (why_rank_stopped()). Such a rank sends no report, so
// the trace waits no grace period for it.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace partrain {
class PeerError;
}

namespace partrain::comm {

class Store;

struct FailureTrace {
  int culprit = -1;         // the rank to name; -1 when nothing could be learned
  std::vector<int> silent;  // when found by silence: every rank that sent no report in time
  bool store_lost = false;  // the store stopped answering during the trace
  std::vector<int> heard;   // the ranks whose report this rank read, each once
};

// Never throws: the store may die with a failed rank (rank 0 hosts it), and then the last rank
// the chain of blame reached is kept (`blamed` when it reached no further).
FailureTrace trace_failed_rank(Store& store, const std::string& prefix, int rank, int size,
                               int blamed, std::chrono::milliseconds grace,
                               std::chrono::milliseconds patience);

// Where rank `rank` says why it stopped: "rank R (HOST) stopped: WHY".
std::string rank_stopped_key(int rank);

// What `rank` said under rank_stopped_key(), if it said anything; no request waits longer than
// `bound`. Never throws: nullopt where the store cannot tell (it may have gone with that rank).
std::optional<std::string> why_rank_stopped(Store& store, int rank,
                                            std::chrono::milliseconds bound);

// The grace period for a communicator timeout: long enough for the other survivors to
// report, short against the timeout.
std::chrono::milliseconds failure_grace(std::chrono::milliseconds timeout);

}  // namespace partrain::comm
