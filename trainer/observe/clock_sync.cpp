#include "trainer/observe/clock_sync.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain {
namespace {

std::string key(int rank, int round, const char* leg) {
  return "observe/clock/" + std::to_string(rank) + "/" + std::to_string(round) + "/" + leg;
}

std::vector<std::uint8_t> encode(double a, double b) {
  std::vector<std::uint8_t> bytes(2 * sizeof(double));
  std::memcpy(bytes.data(), &a, sizeof(double));
  std::memcpy(bytes.data() + sizeof(double), &b, sizeof(double));
  return bytes;
}

}  // namespace

double clock_offset_of(const ClockProbe& p) { return ((p.t0 - p.t1) + (p.t3 - p.t2)) / 2.0; }

ClockEstimate estimate_clock_offset(comm::Store& store, int rank, int world_size, int rounds,
                                    const std::function<double()>& now) {
  PARTRAIN_CHECK(rounds >= 1, Error, "clock estimate needs at least one round trip");
  ClockEstimate best;
  if (world_size <= 1) return best;
  if (rank == 0) {
    for (int r = 1; r < world_size; ++r) {
      for (int k = 0; k < rounds; ++k) {
        store.get(key(r, k, "ask"));  // waits, bounded by the store's timeout
        const double t1 = now();
        const double t2 = now();
        store.set(key(r, k, "answer"), encode(t1, t2));
      }
    }
    return best;
  }
  bool have = false;
  for (int k = 0; k < rounds; ++k) {
    ClockProbe probe;
    probe.t0 = now();
    store.set(key(rank, k, "ask"), {1});
    const std::vector<std::uint8_t> answer = store.get(key(rank, k, "answer"));
    probe.t3 = now();
    PARTRAIN_CHECK(answer.size() == 2 * sizeof(double), CommError,
                   "clock estimate: a malformed answer from rank 0 in the store");
    std::memcpy(&probe.t1, answer.data(), sizeof(double));
    std::memcpy(&probe.t2, answer.data() + sizeof(double), sizeof(double));
    if (!have || probe.round_trip() < best.round_trip_s) {
      best.offset_s = clock_offset_of(probe);
      best.round_trip_s = probe.round_trip();
      have = true;
    }
  }
  return best;
}

}  // namespace partrain
