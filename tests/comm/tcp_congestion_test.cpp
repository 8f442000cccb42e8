// comm.tcp_congestion: which congestion control the peer transport's connections get (Note
// [Congestion control on one machine] in comm_backends/net/timed_io.cpp). auto takes cubic or
// reno between ranks of one machine (one network stack, or network namespaces of one kernel)
// and keeps the system's between machines; system keeps the system's; a name is that
// algorithm everywhere; a wrong name is refused before anything connects.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
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
  // Written well; whether the kernel has it is asked where the connections are made.
  EXPECT_EQ(tcp_congestion_problem("nosuchcc"), "");
  EXPECT_NE(net::congestion_refusal("nosuchcc").find("'nosuchcc' refused by this kernel"),
            std::string::npos);
  EXPECT_EQ(net::congestion_refusal("auto"), "");
  EXPECT_EQ(net::congestion_refusal("reno"), "");  // built into every Linux kernel
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

TEST(TcpCongestion, TheAddressARankPublishesCarriesItsMachine) {
  const std::string text = encode_peer_address({"[fd00::1]:4000", "b00t-1d"});
  const PeerAddress back = decode_peer_address(text);
  EXPECT_EQ(back.listen, "[fd00::1]:4000");
  EXPECT_EQ(back.machine, "b00t-1d");
  EXPECT_EQ(decode_peer_address(encode_peer_address({"", "m"})).listen, "");  // rank 0
  EXPECT_EQ(decode_peer_address("10.0.0.1:5").machine, "");
}

// Rank 0, which listens for no one, refuses as early as the others.
TEST(TcpCongestion, AWrongNameIsRefusedBeforeAnythingConnects) {
  std::vector<std::pair<std::string, std::string>> cases = {{"Cubic", "is not auto, system"}};
#if defined(__linux__)
  cases.emplace_back("nosuchcc", "refused by this kernel");
#endif
  for (const auto& [name, why] : cases) {
    for (const int rank : {0, 1}) {
      testing::ScratchDir dir;
      auto store = open_store(dir.url(), StoreOptions{});
      PeerTransportOptions options;
      options.tcp_congestion = name;
      try {
        PeerTransport transport(*store, rank, 2, options);
        ADD_FAILURE() << "rank " << rank << " took " << name;
      } catch (const UsageError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("comm.tcp_congestion '" + name + "'"), std::string::npos) << what;
        EXPECT_NE(what.find(why), std::string::npos) << what;
      }
    }
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

// Two namespace hosts of this machine whose default is an algorithm auto does not pick (bbr
// where the kernel has it), so that every assertion below can fail: auto's pick is cubic
// (root may set any the kernel has), else reno.
class TcpCongestionHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hosts_.ok()) GTEST_SKIP() << hosts_.why_not();
    std::ifstream available_file("/proc/sys/net/ipv4/tcp_available_congestion_control");
    std::vector<std::string> available;
    for (std::string name; available_file >> name;) available.push_back(name);
    const auto has = [&](const std::string& name) {
      return std::find(available.begin(), available.end(), name) != available.end();
    };
    pick_ = has("cubic") ? "cubic" : "reno";
    foreign_ = has("bbr") ? "bbr" : "";
    for (const auto& name : available) {
      if (foreign_.empty() && name != "cubic" && name != "reno") foreign_ = name;
    }
    if (foreign_.empty())
      GTEST_SKIP() << "this kernel has no congestion control but cubic and reno";
    for (int h = 0; h < 2; ++h) {
      ASSERT_TRUE(hosts_.shell(h, "sysctl -q -w net.ipv4.tcp_congestion_control=" + foreign_));
    }
  }
  void expect_both(const Seen& seen, const std::string& name, const char* what) {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(seen.used[rank], name) << what << ": rank " << rank;
    }
  }
  partrain_test::NetnsHosts hosts_{2, 78};
  std::string pick_, foreign_;
};

TEST_F(TcpCongestionHosts, OnLoopbackAutoPicksItsOwnSystemKeepsTheDefaultANameGoesEverywhere) {
  const std::vector<std::string> one = {hosts_.name(0), hosts_.name(0)};
  const Seen automatic = trade("auto", one);
  EXPECT_EQ(automatic.system[0], foreign_);
  expect_both(automatic, pick_, "auto");
  expect_both(trade("system", one), foreign_, "system");
  expect_both(trade("reno", one), "reno", "reno");
}

// What `partrain version` prints of it, read inside a host whose default is foreign_.
TEST_F(TcpCongestionHosts, TheSummarySaysWhatAutoTakesWhere) {
  std::string summary;
  std::thread inside([&] {
    const int fd = ::open(("/var/run/netns/" + hosts_.name(0)).c_str(), O_RDONLY);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) return;
    ::close(fd);
    summary = describe_tcp_congestion();
  });
  inside.join();
  EXPECT_EQ(summary, "system default " + foreign_ + "; auto: " + pick_ +
                         " between ranks of one machine, " + foreign_ + " between machines");
}

// Between the two namespace hosts auto picks its own when they are one machine, as here
// (containers of one kernel, joined by veth), and keeps the default when they tell each other
// they are two machines (the accepting side hands its connection the default back). Two ranks
// of one host on its own address (not loopback) share a stack: its own again.
TEST_F(TcpCongestionHosts, AutoPicksItsOwnOnOneMachineAndKeepsTheDefaultBetweenMachines) {
  const std::vector<std::string> two = {hosts_.name(0), hosts_.name(1)};
  const std::vector<std::string> addresses = {hosts_.address(0), hosts_.address(1)};
  const std::vector<std::string> machines = {"machine-a", "machine-b"};
  expect_both(trade("auto", two, addresses), pick_, "namespaces of one machine");
  expect_both(trade("auto", two, addresses, machines), foreign_, "two machines");
  expect_both(trade("auto", {hosts_.name(0), hosts_.name(0)},
                    {hosts_.address(0), hosts_.address(0)}, machines),
              pick_, "one stack");
}

#endif

}  // namespace
}  // namespace partrain::comm
