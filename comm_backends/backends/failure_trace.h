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
#pragma once

#include <chrono>
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
};

// Never throws: the store may die with a failed rank (rank 0 hosts it), and then the last rank
// the chain of blame reached is kept (`blamed` when it reached no further).
FailureTrace trace_failed_rank(Store& store, const std::string& prefix, int rank, int size,
                               int blamed, std::chrono::milliseconds grace,
                               std::chrono::milliseconds patience);

// For a backend whose collective just threw `lost` (call it from the catch block): traces the
// failure from lost.peer_rank() and throws. It rethrows `lost` itself when the chain of blame
// ends at the rank it names (or nowhere), and otherwise a PeerError naming the rank found:
// "BACKEND: rank N failed first (traced through the other ranks' reports); here: <lost>".
[[noreturn]] void rethrow_traced(const PeerError& lost, const std::string& backend, Store& store,
                                 const std::string& prefix, int rank, int size,
                                 std::chrono::milliseconds grace,
                                 std::chrono::milliseconds patience);

// The grace period for a communicator timeout: long enough for the other survivors to
// report, short against the timeout.
std::chrono::milliseconds failure_grace(std::chrono::milliseconds timeout);

}  // namespace partrain::comm
