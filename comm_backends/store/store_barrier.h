// defines: store_barrier() — every rank of a world waits until all have arrived, through the
// store: about 3 requests a rank, where each rank waiting for every other's key would be W —
// and store_barrier_arrivals(), store_barrier_release() for a rank that ends one early.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace partrain::comm {

class Store;

// Each rank counts itself in under `name` and marks its arrival; the last to arrive
// publishes name + "/done", which the others wait for (a tcp store answers that wait when
// the key is set, with no polling). On timeout a CommError names the ranks that had not
// arrived (looked up only then). One barrier name serves one barrier. Returns true.
//
// With `stop_waiting`, the wait goes in slices of kBarrierStopSlice, and where stop_waiting()
// is true after one (or before the first) it ends there and returns false: the caller gives up
// on the ranks still missing (and may release the others, store_barrier_release()).
bool store_barrier(Store& store, const std::string& name, int rank, int size,
                   std::chrono::milliseconds timeout,
                   const std::function<bool()>& stop_waiting = {});
inline constexpr std::chrono::milliseconds kBarrierStopSlice{100};

// How many ranks have arrived at barrier `name` so far.
std::int64_t store_barrier_arrivals(Store& store, const std::string& name);

// Ends barrier `name` for every rank, arrived or not: each waiting one returns (true), and one
// that arrives later passes at once.
void store_barrier_release(Store& store, const std::string& name);

}  // namespace partrain::comm
