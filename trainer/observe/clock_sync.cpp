#include "trainer/observe/clock_sync.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain {
namespace {

std::string key(int rank, int round, const char* leg) {
  return "observe/clock/" + std::to_string(rank) + "/" + std::to_string(round) + "/" + leg;
}

// A rank's word that its steady clock is rank 0's (or not), on a store without a server.
std::string shared_key(int rank) { return "observe/clock/" + std::to_string(rank) + "/shared"; }

std::vector<std::uint8_t> encode(double a, double b) {
  std::vector<std::uint8_t> bytes(2 * sizeof(double));
  std::memcpy(bytes.data(), &a, sizeof(double));
  std::memcpy(bytes.data() + sizeof(double), &b, sizeof(double));
  return bytes;
}

// The two figures encode() wrote at the start of `bytes` (which may hold more after them), or
// a CommError naming `what` from rank 0 as malformed.
std::pair<double, double> decode(const std::vector<std::uint8_t>& bytes, const char* what) {
  PARTRAIN_CHECK(bytes.size() >= 2 * sizeof(double), CommError, "clock estimate: a malformed ",
                 what, " from rank 0 in the store");
  std::pair<double, double> out;
  std::memcpy(&out.first, bytes.data(), sizeof(double));
  std::memcpy(&out.second, bytes.data() + sizeof(double), sizeof(double));
  return out;
}

}  // namespace

double clock_offset_of(const ClockProbe& p) { return ((p.t0 - p.t1) + (p.t3 - p.t2)) / 2.0; }

namespace {

// This rank's clock against the store server's, from the reading of the server's clock with
// the shortest round trip among at least `rounds` (the server reads its clock once, so
// t1 = t2). Null when the store has no server.
std::optional<ClockEstimate> against_the_server(comm::Store& store, int rounds,
                                                const LocalSeconds& local) {
  const std::optional<comm::ServerClockReading> reading = store.server_clock(rounds);
  if (!reading) return std::nullopt;
  ClockProbe probe;
  probe.t0 = local(reading->sent);
  probe.t1 = probe.t2 = static_cast<double>(reading->server_ns) * 1e-9;
  probe.t3 = local(reading->received);
  return ClockEstimate{clock_offset_of(probe), probe.round_trip()};
}

}  // namespace

ClockEstimate estimate_clock_offset(comm::Store& store, int rank, int world_size, int rounds,
                                    const LocalSeconds& local, const std::string& clock_given) {
  const auto now = [&] { return local(std::chrono::steady_clock::now()); };
  PARTRAIN_CHECK(rounds >= 1, Error, "clock estimate needs at least one round trip");
  ClockEstimate best;
  if (world_size <= 1) return best;
  // Every rank against the server's clock at once, then against rank 0's through the figure
  // rank 0 publishes: rank r minus rank 0 is (r minus server) - (0 minus server), within the
  // two half round trips.
  if (const std::optional<ClockEstimate> mine = against_the_server(store, rounds, local)) {
    const std::string key0 = "observe/clock/server/0";
    if (rank == 0) {
      store.set(key0, encode(mine->offset_s, mine->round_trip_s));
      return best;
    }
    const std::vector<std::uint8_t> theirs = store.get(key0);
    PARTRAIN_CHECK(theirs.size() == 2 * sizeof(double), CommError,
                   "clock estimate: a malformed figure from rank 0 in the store");
    const auto [offset0, round_trip0] = decode(theirs, "figure");
    return ClockEstimate{mine->offset_s - offset0, mine->round_trip_s + round_trip0};
  }
  // A store without a server. A rank whose steady clock is rank 0's (one boot of one machine,
  // as the ranks of a file store mostly are) is off rank 0's by what each adds to that clock
  // (`local`), which is known exactly; rank 0 answers the others' round trips in turn.
  const std::string clock = clock_given.empty() ? comm::steady_clock_identity() : clock_given;
  const auto at = std::chrono::steady_clock::now();
  const double own = local(at) - std::chrono::duration<double>(at.time_since_epoch()).count();
  const std::string key0 = "observe/clock/0/identity";
  if (rank == 0) {
    std::vector<std::uint8_t> value = encode(own, 0.0);
    value.resize(2 * sizeof(double) + clock.size());  // then the identity
    std::copy(clock.begin(), clock.end(), value.begin() + 2 * sizeof(double));
    store.set(key0, value);
    for (int r = 1; r < world_size; ++r) {
      // Waits, bounded by the store's timeout, like each read below.
      if (store.get(shared_key(r)) == std::vector<std::uint8_t>{1}) continue;
      for (int k = 0; k < rounds; ++k) {
        store.get(key(r, k, "ask"));
        const double t1 = now();
        const double t2 = now();
        store.set(key(r, k, "answer"), encode(t1, t2));
      }
    }
    return best;
  }
  const std::vector<std::uint8_t> zero = store.get(key0);
  const double own0 = decode(zero, "figure").first;
  const bool shared =
      !clock.empty() && std::string(zero.begin() + 2 * sizeof(double), zero.end()) == clock;
  store.set(shared_key(rank), {static_cast<std::uint8_t>(shared ? 1 : 0)});
  if (shared) return ClockEstimate{own - own0, 0.0};
  bool have = false;
  for (int k = 0; k < rounds; ++k) {
    ClockProbe probe;
    probe.t0 = now();
    store.set(key(rank, k, "ask"), {1});
    const std::vector<std::uint8_t> answer = store.get(key(rank, k, "answer"));
    probe.t3 = now();
    PARTRAIN_CHECK(answer.size() == 2 * sizeof(double), CommError,
                   "clock estimate: a malformed answer from rank 0 in the store");
    std::tie(probe.t1, probe.t2) = decode(answer, "answer");
    if (!have || probe.round_trip() < best.round_trip_s) {
      best.offset_s = clock_offset_of(probe);
      best.round_trip_s = probe.round_trip();
      have = true;
    }
  }
  return best;
}

}  // namespace partrain
