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

// Round trips of the clock estimate per rank (the best one is kept).
inline constexpr int kClockRounds = 8;

struct ClockEstimate {
  double offset_s = 0;      // this rank's clock minus rank 0's; 0 on rank 0
  double round_trip_s = 0;  // of the round trip it came from (its error is at most half)
};

// Every rank of the group calls it, once, with the same `rounds` (>= 1). On a store with a
// server (tcp) every rank reads the server's clock `rounds` times at once and keeps its best
// offset to it; rank 0 publishes its own, and each rank's offset to rank 0 is the difference
// (error within the two half round trips): rounds + 1 requests a rank, none serial across
// ranks. On a file store rank 0 answers rounds round trips of each other rank in rank order
// (about 2 x rounds x W requests one after another: fine for the few ranks of one host). `now`
// reads this rank's clock in seconds. Each wait is bounded by the store's timeout.
ClockEstimate estimate_clock_offset(comm::Store& store, int rank, int world_size, int rounds,
                                    const std::function<double()>& now);

}  // namespace partrain
