// A connection the listener accepted no longer wakes the listener's thread: past its handshake
// it leaves the listener's io_context, so a rank that still waits for other lower ranks to
// connect pays no thread switch per message that arrives.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/store/store.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

// The voluntary context switches of every thread of this process named `name`, or -1 where
// /proc does not tell.
std::int64_t voluntary_switches(const std::string& name) {
  const std::filesystem::path tasks = "/proc/self/task";
  std::error_code ec;
  if (!std::filesystem::is_directory(tasks, ec)) return -1;
  std::int64_t total = 0;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string comm_name;
    if (!std::getline(comm, comm_name) || comm_name != name) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      const std::string key = "voluntary_ctxt_switches:";
      if (line.rfind(key, 0) == 0) total += std::stoll(line.substr(key.size()));
    }
  }
  return total;
}

TEST(PeerListener, AcceptedConnectionsDoNotWakeIt) {
#if !defined(__linux__)
  GTEST_SKIP() << "counts thread switches through /proc";
#endif
  // Ranks 0 and 2 trade messages; rank 1 never connects to rank 2, so rank 2's listener stays
  // open for it the whole time, beside the connection rank 0 made.
  constexpr int kWorld = 3;
  constexpr int kRoundTrips = 2000;
  testing::ScratchDir dir;
  std::int64_t before = -1, after = -1;
  testing::run_ranks(kWorld, [&](int rank) {
    StoreOptions store_options;
    store_options.timeout = milliseconds(20000);
    auto store = open_store(dir.url(), store_options);
    PeerTransportOptions options;
    options.token = "listener-test";
    options.timeout = milliseconds(20000);
    PeerTransport transport(*store, rank, kWorld, options);
    if (rank == 1) return;  // it was there to be waited for
    const int peer = rank == 0 ? 2 : 0;
    std::uint64_t value = 0;
    for (int i = 0; i < kRoundTrips; ++i) {
      CollectiveCall call;
      call.sequence = static_cast<std::uint64_t>(i);
      call.bytes = sizeof value;
      call.kind = static_cast<std::uint8_t>(CollectiveKind::broadcast);
      transport.begin(call);
      PeerTransport::Transfer out, in;
      out.peer = in.peer = peer;
      out.outgoing = true;
      out.data = in.data = &value;
      out.bytes = in.bytes = sizeof value;
      if (rank == 0) {
        ++value;
        transport.start(out);
        transport.wait(out);
        transport.start(in);
        transport.wait(in);
      } else {
        transport.start(in);
        transport.wait(in);
        transport.start(out);
        transport.wait(out);
      }
      transport.end();
      // Counted from the first round trip on: the handshake's own wake-ups are not the point.
      if (rank == 2 && i == 0) before = voluntary_switches("partrain-listen");
    }
    if (rank == 2) after = voluntary_switches("partrain-listen");
    EXPECT_EQ(value, static_cast<std::uint64_t>(kRoundTrips));
  });
  ASSERT_GE(before, 0);
  // Registered with the listener's epoll, each of the 2000 messages into rank 2 woke its
  // listener (about one switch each); on a context of their own, none.
  EXPECT_LT(after - before, kRoundTrips / 20)
      << "the listener's threads switched " << after - before << " times in " << kRoundTrips
      << " round trips";
}

}  // namespace
}  // namespace partrain::comm
