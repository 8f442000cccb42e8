// Which address a rank binds and publishes (net/local_address.h), and the tcp store with
// host names and IPv6 wherever an address is accepted.
#include "comm_backends/net/local_address.h"

#include <gtest/gtest.h>

#include <boost/asio/ip/host_name.hpp>
#include <cstdint>
#include <cstdlib>

#include "common/errors.h"
#include "comm_backends/store/store.h"
#include "comm_backends/store/tcp_store.h"

namespace partrain::comm {
namespace {

using net::BindAddressRequest;
using net::choose_bind_address;

BindAddressRequest request() {
  BindAddressRequest r;
  r.read_environment = false;
  return r;
}

TEST(BindAddress, RouteToTheMasterPicksTheSourceAddress) {
  auto r = request();
  r.master_host = "127.0.0.1";
  EXPECT_EQ(choose_bind_address(r), "127.0.0.1");
  r.master_host = "localhost";
  EXPECT_TRUE(net::is_loopback_host(choose_bind_address(r))) << choose_bind_address(r);
  r.master_host = "::1";
  EXPECT_EQ(choose_bind_address(r), "::1");
  r.master_host = "[::1]";
  EXPECT_EQ(choose_bind_address(r), "::1");
}

TEST(BindAddress, InterfaceAndHostOverrideTheRoute) {
#if defined(_WIN32)
  GTEST_SKIP() << "NICs are not looked up by name on Windows: comm.host names the address there";
#endif
  auto r = request();
  r.master_host = "127.0.0.1";
  r.interface = "lo";
  EXPECT_EQ(choose_bind_address(r), "127.0.0.1");
  r.master_host = "::1";
  EXPECT_EQ(choose_bind_address(r), "::1") << "an IPv6 master gets the NIC's IPv6 address";
  EXPECT_EQ(net::interface_with_address("127.0.0.1"), "lo");
  EXPECT_EQ(net::interface_with_address("192.0.2.77"), "");
  r.interface.clear();
  r.host = "localhost";
  EXPECT_EQ(choose_bind_address(r), "127.0.0.1");
}

TEST(BindAddress, SingleHostWithoutMasterIsLoopback) {
  auto r = request();
  r.single_host = true;
  EXPECT_EQ(choose_bind_address(r), "127.0.0.1");
}

TEST(BindAddress, WrongSettingsAreUsageErrorsNamingThem) {
#if defined(_WIN32)
  GTEST_SKIP() << "NICs are not looked up by name on Windows: comm.host names the address there";
#endif
  auto r = request();
  r.master_host = "127.0.0.1";
  r.interface = "nosuchnic0";
  try {
    choose_bind_address(r);
    FAIL() << "an interface that does not exist was accepted";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("comm.interface"), std::string::npos) << what;
    EXPECT_NE(what.find("'nosuchnic0' does not exist"), std::string::npos) << what;
    EXPECT_NE(what.find("lo"), std::string::npos) << "the interfaces there are: " << what;
  }
  r.interface.clear();
  r.host = "192.0.2.77";  // TEST-NET-1: never an address of this host
  EXPECT_THROW(choose_bind_address(r), UsageError);
  r.host = "no-such-host.invalid";
  EXPECT_THROW(choose_bind_address(r), UsageError);
  r.host.clear();
  r.master_host = "no-such-host.invalid";
  EXPECT_THROW(choose_bind_address(r), UsageError);
}

TEST(BindAddress, EnvironmentOverridesTheConfiguredInterface) {
#if defined(_WIN32)
  GTEST_SKIP() << "NICs are not looked up by name on Windows: comm.host names the address there";
#endif
  ::setenv(net::kSocketInterfaceEnv, "nosuchnic1", 1);
  BindAddressRequest r = request();
  r.read_environment = true;
  r.master_host = "127.0.0.1";
  r.interface = "lo";
  try {
    choose_bind_address(r);
    ADD_FAILURE() << net::kSocketInterfaceEnv << " was ignored";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(net::kSocketInterfaceEnv), std::string::npos) << e.what();
  }
  ::setenv(net::kSocketInterfaceEnv, "lo", 1);
  r.interface = "nosuchnic2";
  EXPECT_EQ(choose_bind_address(r), "127.0.0.1");
  ::unsetenv(net::kSocketInterfaceEnv);
}

StoreOptions store_options(bool host) {
  StoreOptions o;
  o.token = "names";
  o.timeout = std::chrono::milliseconds(3000);
  o.host_server = host;
  return o;
}

std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

TEST(TcpStoreAddresses, HostNamesAndIpv6Everywhere) {
  // IPv6 literal, bracketed in the url as usual.
  TcpStore v6("::1", 0, store_options(true));
  auto client6 = open_store("tcp://[::1]:" + std::to_string(v6.port()), store_options(false));
  client6->set("k", bytes("v6"));
  EXPECT_EQ(v6.get("k"), bytes("v6"));

  // This host's own name, as MASTER_ADDR=node01 would give it: served on every address. A
  // container may have a name that nothing resolves; then "localhost" stands in for it.
  std::string name = boost::asio::ip::host_name();
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::resolver resolver(io);
    boost::system::error_code ec;
    resolver.resolve(name, "", ec);
    if (ec) name = "localhost";
  }
  TcpStore named(name, 0, store_options(true));
  auto by_name =
      open_store("tcp://" + name + ":" + std::to_string(named.port()), store_options(false));
  by_name->set("k", bytes("named"));
  EXPECT_EQ(named.get("k"), bytes("named"));
  auto by_loopback =
      open_store("tcp://localhost:" + std::to_string(named.port()), store_options(false));
  EXPECT_EQ(by_loopback->get("k"), bytes("named"));

  // env:// with a host name.
  ::setenv("MASTER_ADDR", "localhost", 1);
  ::setenv("MASTER_PORT", std::to_string(named.port()).c_str(), 1);
  EXPECT_EQ(open_store("env://", store_options(false))->get("k"), bytes("named"));
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
}

}  // namespace
}  // namespace partrain::comm
