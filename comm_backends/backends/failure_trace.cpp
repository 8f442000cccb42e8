#include "comm_backends/backends/failure_trace.h"

#include <algorithm>
#include <set>
#include <thread>

#include "comm_backends/store/store.h"

namespace partrain::comm {

std::chrono::milliseconds failure_grace(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 10, std::chrono::milliseconds(200), std::chrono::milliseconds(2000));
}

FailureTrace trace_failed_rank(Store& store, const std::string& prefix, int rank, int size,
                               int blamed, std::chrono::milliseconds grace) {
  FailureTrace trace;
  trace.culprit = blamed;
  const auto key = [&prefix](int r) { return prefix + "failed/" + std::to_string(r); };
  const auto deadline = std::chrono::steady_clock::now() + grace;
  // Bounded by the grace period: each poll of a missing report sleeps 5 ms until then.
  const auto reported = [&](int r) {
    while (!store.check({key(r)}) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return store.check({key(r)});
  };
  try {
    const std::string mine = std::to_string(blamed);
    store.set(key(rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
    if (blamed < 0) {
      for (int r = 0; r < size; ++r) {
        if (r != rank && !reported(r)) trace.silent.push_back(r);
      }
      if (!trace.silent.empty()) trace.culprit = trace.silent.front();
      return trace;
    }
    std::set<int> visited{rank};
    int suspect = blamed;
    while (visited.insert(suspect).second) {
      if (!reported(suspect)) {
        trace.culprit = suspect;
        return trace;
      }
      const auto report = store.get(key(suspect));
      const int next = std::stoi(std::string(report.begin(), report.end()));
      // A report that blames nobody, or something out of range: the chain ends at `blamed`.
      if (next < 0 || next >= size) return trace;
      suspect = next;
    }
    return trace;  // the reports go round in a circle: keep what we saw ourselves
  } catch (const std::exception&) {
    return trace;
  }
}

}  // namespace partrain::comm
