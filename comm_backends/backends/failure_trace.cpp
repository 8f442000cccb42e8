#include "comm_backends/backends/failure_trace.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <thread>

#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain::comm {

std::chrono::milliseconds failure_grace(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 10, std::chrono::milliseconds(200), std::chrono::milliseconds(2000));
}

FailureTrace trace_failed_rank(Store& store, const std::string& prefix, int rank, int size,
                               int blamed, std::chrono::milliseconds grace,
                               std::chrono::milliseconds patience) {
  using Clock = std::chrono::steady_clock;
  FailureTrace trace;
  trace.culprit = blamed;
  const auto key = [&prefix](int r) { return prefix + "failed/" + std::to_string(r); };
  const auto start = Clock::now();
  const auto grace_end = start + grace;
  // A rank that said why it stopped (rank_stopped_key()) went on an error of its own, or was
  // killed: it sends no report, so nobody waits for one.
  const auto stopped = [&](int r) { return store.check({rank_stopped_key(r)}); };
  // Bounded by the grace period: each poll of a missing report sleeps 5 ms until then.
  const auto note_heard = [&](int r) {
    if (std::find(trace.heard.begin(), trace.heard.end(), r) == trace.heard.end()) {
      trace.heard.push_back(r);
    }
  };
  const auto reported = [&](int r) {
    while (!store.check({key(r)}) && !stopped(r) && Clock::now() < grace_end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const bool has = store.check({key(r)});
    if (has) note_heard(r);
    return has;
  };
  // The store may be across the same dead link: no request may take more than the grace
  // period. The communicator is broken now, so nothing else waits on this store meanwhile.
  const ScopedStoreTimeout bound(store, grace);
  try {
    const std::string mine = std::to_string(blamed);
    store.set(key(rank), std::vector<std::uint8_t>(mine.begin(), mine.end()));
    if (blamed >= 0) {
      std::set<int> visited{rank, blamed};
      int suspect = blamed;
      for (;;) {
        if (!reported(suspect)) {
          trace.culprit = suspect;
          return trace;
        }
        const auto report = store.get(key(suspect));
        const int next = std::stoi(std::string(report.begin(), report.end()));
        if (next >= size) return trace;
        if (next < 0) break;  // it could not tell either: look for the silent ones
        if (!visited.insert(next).second) return trace;  // a circle: keep the last one named
        // The best name so far. It is kept if the store goes away during the rest of the
        // trace: the store may live in a rank that is stopping because of this very failure.
        suspect = next;
        trace.culprit = next;
      }
    }
    // Who sent no report? A survivor stuck on the lost rank reports once its own wait times
    // out, so while more than one is silent the wait goes on, up to `patience` plus the
    // grace period; polls are 5 ms apart.
    // A grace period past the timeout: the stuck survivor's own wait started a little
    // after ours, and it reports once that ends.
    const auto patience_end = start + patience + grace;
    for (;;) {
      trace.silent.clear();
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        if (store.check({key(r)})) {
          note_heard(r);
        } else {
          trace.silent.push_back(r);
        }
      }
      const auto now = Clock::now();
      const bool one_left_that_stopped = trace.silent.size() == 1 && stopped(trace.silent[0]);
      if (((now >= grace_end || one_left_that_stopped) && trace.silent.size() <= 1) ||
          now >= patience_end) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!trace.silent.empty()) trace.culprit = trace.silent.front();
    return trace;
  } catch (const std::exception&) {
    trace.store_lost = true;
    return trace;
  }
}

std::string rank_stopped_key(int rank) { return "ranks/stopped/" + std::to_string(rank); }

std::optional<std::string> why_rank_stopped(Store& store, int rank,
                                            std::chrono::milliseconds bound) {
  const auto why = try_get(store, rank_stopped_key(rank), bound);
  if (!why) return std::nullopt;
  return std::string(why->begin(), why->end());
}

}  // namespace partrain::comm
