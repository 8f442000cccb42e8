#include "comm_backends/store/store_barrier.h"

#include <algorithm>
#include <vector>

#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {

bool store_barrier(Store& store, const std::string& name, int rank, int size,
                   std::chrono::milliseconds timeout, const std::function<bool()>& stop_waiting) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size, UsageError, "barrier '", name, "': rank ",
                 rank, " is outside a world of ", size);
  if (size == 1) return true;
  const std::string done = name + "/done";
  store.set(name + "/in/" + std::to_string(rank), {1});
  if (store.add(name + "/count", 1) == size) {
    store.set(done, {1});
    return true;
  }
  try {
    if (!stop_waiting) {
      store.wait({done}, timeout);
      return true;
    }
    // Slices until the bound, the last one shorter.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (stop_waiting()) return false;
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= left.zero()) {
        throw CommError("key '" + done + "' did not appear within " +
                        std::to_string(timeout.count()) + " ms");
      }
      try {
        store.wait({done}, std::min(left, kBarrierStopSlice));
        return true;
      } catch (const CommError&) {
        // The slice passed, or the store is lost, where check() throws in turn.
        if (store.check({done})) return true;
      }
    }
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

std::int64_t store_barrier_arrivals(Store& store, const std::string& name) {
  return store.add(name + "/count", 0);
}

void store_barrier_release(Store& store, const std::string& name) {
  store.set(name + "/done", {1});
}

}  // namespace partrain::comm
