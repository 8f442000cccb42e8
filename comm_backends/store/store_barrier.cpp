#include "comm_backends/store/store_barrier.h"

#include <vector>

#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {

void store_barrier(Store& store, const std::string& name, int rank, int size,
                   std::chrono::milliseconds timeout) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "barrier '", name, "': rank ",
                 rank, " is outside a world of ", size);
  if (size == 1) return;
  const std::string done = name + "/done";
  store.set(name + "/in/" + std::to_string(rank), {1});
  if (store.add(name + "/count", 1) == size) {
    store.set(done, {1});
    return;
  }
  try {
    store.wait({done}, timeout);
  } catch (const CommError& e) {
    // Who is missing is worth a read per rank, but only once the barrier has failed; the
    // list is cut at the first few.
    std::string missing;
    int named = 0;
    for (int r = 0; r < size && named < 8; ++r) {
      if (store.check({name + "/in/" + std::to_string(r)})) continue;
      missing += (named++ == 0 ? "" : ", ") + std::to_string(r);
    }
    throw CommError("barrier '" + name + "': " +
                    (missing.empty() ? std::string("every rank arrived, but none said so")
                                     : "rank(s) " + missing + " did not arrive") +
                    " within " + std::to_string(timeout.count()) + " ms (" + e.what() + ")");
  }
}

}  // namespace partrain::comm
