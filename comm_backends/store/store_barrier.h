// defines: store_barrier() — every rank of a world waits until all have arrived, through the
// store: about 3 requests a rank, where each rank waiting for every other's key would be W.
#pragma once

#include <chrono>
#include <string>

namespace partrain::comm {

class Store;

// Each rank counts itself in under `name` and marks its arrival; the last to arrive
// publishes name + "/done", which the others wait for (a tcp store answers that wait when
// the key is set, with no polling). On timeout a CommError names the ranks that had not
// arrived (looked up only then). One barrier name serves one barrier.
void store_barrier(Store& store, const std::string& name, int rank, int size,
                   std::chrono::milliseconds timeout);

}  // namespace partrain::comm
