// comm.tcp_congestion: which congestion control the peer transport's connections get (Note
// [Congestion control on one machine] in comm_backends/net/timed_io.cpp). auto takes cubic or
// reno between ranks of one machine (one network stack, or network namespaces of one kernel)
// and keeps the system's between machines; system keeps the system's; a name is that
// algorithm everywhere; a wrong name is refused before anything connects.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "comm_backends/communicator.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

#if defined(__linux__)
#include <fcntl.h>
#include <sched.h>

#include "tests/multinode/netns.h"
#endif

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;
namespace ip = boost::asio::ip;

TEST(TcpCongestion, RequestsAreCheckedByName) {
  EXPECT_EQ(tcp_congestion_problem("auto"), "");
  EXPECT_EQ(tcp_congestion_problem("system"), "");
  for (const char* bad : {"Cubic", "cubic!", "", "a_name_far_too_long", "reno bbr"}) {
    EXPECT_NE(tcp_congestion_problem(bad).find("is not auto, system or the name"),
              std::string::npos)
        << bad;
  }
#if defined(__linux__)
  EXPECT_NE(tcp_congestion_problem("nosuchcc").find("is not a congestion control this kernel has"),
            std::string::npos);
  EXPECT_EQ(tcp_congestion_problem("reno"), "");  // built into every Linux kernel
#else
  EXPECT_NE(tcp_congestion_problem("reno").find("only Linux"), std::string::npos);
#endif
}

TEST(TcpCongestion, OneStackIsLoopbackOrTheSameAddress) {
  const auto at = [](const char* address) {
    return net::tcp::endpoint(ip::make_address(address), 1);
  };
  EXPECT_TRUE(net::same_stack(at("127.0.0.1"), at("127.0.0.1")));
  EXPECT_TRUE(net::same_stack(at("::1"), at("::1")));
  EXPECT_TRUE(net::same_stack(at("10.1.2.3"), at("10.1.2.3")));
  EXPECT_FALSE(net::same_stack(at("10.1.2.3"), at("10.1.2.4")));
  EXPECT_FALSE(net::same_stack(at("fd00::1"), at("fd00::2")));
}

TEST(TcpCongestion, AWrongNameIsRefusedBeforeAnythingConnects) {
  testing::ScratchDir dir;
  auto store = open_store(dir.url(), StoreOptions{});
  PeerTransportOptions options;
  options.tcp_congestion = "Cubic";
  try {
    PeerTransport transport(*store, 1, 2, options);
    FAIL() << "a wrong congestion control was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("comm.tcp_congestion 'Cubic'"), std::string::npos)
        << e.what();
  }
}

#if defined(__linux__)

std::string system_default() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  in >> name;
  return name;
}

// Two ranks as threads, each optionally inside a network namespace (`namespaces`, empty: this
// process's) and telling the other it runs on machine `machines[rank]` (empty: this one's
// kernel), trade one message; returns what each rank's connection to the other uses and, per
// rank, the default of the stack it ran in.
struct Seen {
  std::vector<std::string> used{2}, system{2};
};
Seen trade(const std::string& request, const std::vector<std::string>& namespaces = {},
           const std::vector<std::string>& bind_hosts = {"127.0.0.1", "127.0.0.1"},
           const std::vector<std::string>& machines = {"", ""}) {
  testing::ScratchDir dir;
  Seen seen;
  testing::run_ranks(2, [&](int rank) {
    if (!namespaces.empty()) {
      const int fd = ::open(("/var/run/netns/" + namespaces[rank]).c_str(), O_RDONLY);
      ASSERT_GE(fd, 0) << namespaces[rank];
      ASSERT_EQ(::setns(fd, CLONE_NEWNET), 0);  // this thread only
      ::close(fd);
    }
    seen.system[rank] = system_default();
    StoreOptions store_options;
    store_options.timeout = milliseconds(20000);
    auto store = open_store(dir.url(), store_options);
    PeerTransportOptions options;
    options.token = "congestion-test";
    options.timeout = milliseconds(20000);
    options.bind_host = bind_hosts[rank];
    options.tcp_congestion = request;
    options.machine = machines[rank];
    PeerTransport transport(*store, rank, 2, options);
    std::uint64_t value = 7;
    CollectiveCall call;
    call.bytes = sizeof value;
    call.kind = static_cast<std::uint8_t>(CollectiveKind::broadcast);
    transport.begin(call);
    PeerTransport::Transfer message;
    message.peer = 1 - rank;
    message.outgoing = rank == 0;
    message.data = &value;
    message.bytes = sizeof value;
    transport.start(message);
    transport.wait(message);
    transport.end();
    seen.used[rank] = transport.congestion_control(1 - rank);
  });
  return seen;
}

TEST(TcpCongestion, AutoTakesALossBasedOneOnLoopback) {
  const Seen seen = trade("auto");
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(seen.used[rank] == "cubic" || seen.used[rank] == "reno")
        << "rank " << rank << " uses " << seen.used[rank];
  }
}

TEST(TcpCongestion, SystemKeepsTheDefaultAndANameGoesEverywhere) {
  const Seen system = trade("system");
  EXPECT_EQ(system.used[0], system_default());
  EXPECT_EQ(system.used[1], system_default());
  const Seen reno = trade("reno");
  EXPECT_EQ(reno.used[0], "reno");
  EXPECT_EQ(reno.used[1], "reno");
}

// Two namespace hosts whose default is not what auto picks: between them auto picks its own
// when they are one machine, as here (containers of one kernel, joined by veth), and keeps
// each one's default when they tell each other they are two machines. Between two ranks of
// one of them on its own address (not loopback), one stack, it picks its own again.
TEST(TcpCongestion, AutoPicksItsOwnOnOneMachineAndKeepsTheDefaultBetweenMachines) {
  partrain_test::NetnsHosts hosts(2, 78);
  if (!hosts.ok()) GTEST_SKIP() << hosts.why_not();
  std::ifstream available_file("/proc/sys/net/ipv4/tcp_available_congestion_control");
  const std::string available((std::istreambuf_iterator<char>(available_file)), {});
  const std::string host_default = available.find("bbr") != std::string::npos ? "bbr" : "reno";
  for (int h = 0; h < 2; ++h) {
    ASSERT_TRUE(hosts.shell(h, "sysctl -q -w net.ipv4.tcp_congestion_control=" + host_default));
  }
  const std::vector<std::string> two = {hosts.name(0), hosts.name(1)};
  const std::vector<std::string> addresses = {hosts.address(0), hosts.address(1)};
  const auto picked_own = [](const Seen& seen, const char* what) {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(seen.used[rank] == "cubic" || seen.used[rank] == "reno")
          << what << ": rank " << rank << " uses " << seen.used[rank];
    }
  };
  picked_own(trade("auto", two, addresses), "namespaces of one machine");
  const Seen machines = trade("auto", two, addresses, {"machine-a", "machine-b"});
  EXPECT_EQ(machines.system[0], host_default);
  EXPECT_EQ(machines.used[0], host_default);
  EXPECT_EQ(machines.used[1], host_default);
  picked_own(trade("auto", {hosts.name(0), hosts.name(0)}, {hosts.address(0), hosts.address(0)},
                   {"machine-a", "machine-b"}),
             "one stack");
}

#endif

}  // namespace
}  // namespace partrain::comm
