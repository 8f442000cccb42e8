// defines: ClockProbe, clock_offset_of() and estimate_clock_offset() — how far each rank's
// clock is from rank 0's, estimated at start-up by NTP-style round trips through the store,
// so that every rank's times can be put on rank 0's clock. LibTorch-free.
//
// One round trip between rank r and rank 0 (each reading its own clock):
//
//   rank r:  t0 --- request --->                       ---> t3
//   rank 0:                      t1 (got it) t2 (answer) ---^
//
// offset = ((t1 - t0) + (t2 - t3)) / 2 is rank 0's clock minus rank r's, exact when the two
// legs take equally long; its error is at most half the round trip (t3 - t0) - (t2 - t1). So
// each rank makes several round trips and keeps the one with the smallest round trip.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace partrain {

namespace comm {
class Store;
}

struct ClockProbe {
  double t0 = 0, t1 = 0, t2 = 0, t3 = 0;  // seconds, as above
  double round_trip() const { return (t3 - t0) - (t2 - t1); }
};

// Rank r's clock minus rank 0's, from one round trip: add it to rank 0's times to get r's,
// subtract it from r's times to get rank 0's.
double clock_offset_of(const ClockProbe& probe);

// Readings of the clock per rank for its estimate (the best one is kept).
inline constexpr int kClockRounds = 8;

struct ClockEstimate {
  double offset_s = 0;      // this rank's clock minus rank 0's; 0 on rank 0
  double round_trip_s = 0;  // of the round trip it came from (its error is at most half)
};

// This rank's clock, in seconds, at a time of the steady clock.
using LocalSeconds = std::function<double(std::chrono::steady_clock::time_point)>;

// Every rank of the group calls it, once, with the same `rounds` (>= 1). On a store with a
// server (tcp) every rank keeps the best of `rounds` readings of the server's clock: each
// answer the rank's store client has had carries one, so only the readings still missing
// cost a round trip (none for a rank that already made `rounds` requests, or one on the
// server's own clock, which it reads itself). Rank 0
// publishes its offset to the server, and each rank's offset to rank 0 is the difference
// (error within the two half round trips): at most rounds + 1 requests a rank, none serial
// across ranks. On a file store a rank on rank 0's steady clock (one boot of one machine) is
// known exactly from what rank 0 publishes, and rank 0 answers rounds round trips of each
// other rank in rank order (about 2 x rounds requests a rank one after another: fine for the
// few ranks of one host). On either store the offset of a rank on the clock it holds itself
// against is exact, round trip 0. Each wait is bounded by the store's timeout. `clock`: this
// rank's comm::steady_clock_identity() (tests give ranks different ones to take the round
// trips of the file store).
ClockEstimate estimate_clock_offset(comm::Store& store, int rank, int world_size, int rounds,
                                    const LocalSeconds& local, const std::string& clock = "");

}  // namespace partrain
