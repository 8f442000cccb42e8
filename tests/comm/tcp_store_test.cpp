#include "comm_backends/store/tcp_store.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "comm_backends/net/timed_io.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

StoreOptions options(const std::string& token, bool host) {
  StoreOptions o;
  o.token = token;
  o.timeout = milliseconds(2000);
  o.host_server = host;
  return o;
}

// A connection that is not a partrain client: it gets closed, and learns nothing.
bool stranger_is_closed(int port, const std::string& payload) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket(io);
  const auto deadline = net::deadline_after(milliseconds(3000));
  if (!net::connect_with_retry(io, socket, "127.0.0.1", port, deadline)) return false;
  net::write_all(io, socket, payload.data(), payload.size(), deadline);
  char answer[8];
  // Either the server closes at once, or after its hello timeout; both are "closed".
  auto result =
      net::read_exact(io, socket, answer, sizeof answer, net::deadline_after(milliseconds(12000)));
  return result.status == net::IoStatus::closed;
}

TEST(TcpStore, ClientsShareOneServer) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  ASSERT_GT(host.port(), 0);
  TcpStore client("127.0.0.1", host.port(), options("tok", false));
  host.set("k", bytes("v"));
  EXPECT_EQ(client.get("k"), bytes("v"));
  EXPECT_EQ(client.add("n", 3), 3);
  EXPECT_EQ(host.add("n", 4), 7);
  EXPECT_EQ(client.get("n"), bytes("7"));  // counters read back as decimal text
  EXPECT_TRUE(client.check({"k", "n"}));
  EXPECT_FALSE(client.check({"k", "absent"}));
  EXPECT_THROW(client.wait({"absent"}, milliseconds(50)), CommError);
  EXPECT_THROW(client.set(std::string(kMaxKeyBytes + 1, 'x'), {}), UsageError);
}

TEST(TcpStore, GetWaitsAndAddsAreAtomicAcrossClients) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  testing::run_ranks(5, [&](int rank) {
    TcpStore client("127.0.0.1", host.port(), options("tok", false));
    for (int i = 0; i < 30; ++i) client.add("count", 1);
    if (rank == 4) client.set("done", bytes("yes"));
    EXPECT_EQ(client.get("done"), bytes("yes"));
  });
  EXPECT_EQ(host.add("count", 0), 150);
}

TEST(TcpStore, WrongTokenIsRefused) {
  TcpStore host("127.0.0.1", 0, options("right", true));
  try {
    TcpStore intruder("127.0.0.1", host.port(), options("wrong", false));
    FAIL() << "a client with the wrong token was accepted";
  } catch (const UsageError& e) {
    // Another job on the port: said in so many words, an exit 2 rather than a failed run.
    EXPECT_NE(std::string(e.what()).find("belongs to another run"), std::string::npos) << e.what();
  }
  TcpStore client("127.0.0.1", host.port(), options("right", false));
  client.set("still", bytes("works"));
  EXPECT_EQ(host.get("still"), bytes("works"));
}

TEST(TcpStore, StrangersWithGarbageAreDisconnectedAndStoreKeepsWorking) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  EXPECT_TRUE(stranger_is_closed(host.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  // Right magic, absurd token length: refused before anything is allocated.
  std::string hello(kStoreMagic, 8);
  hello += std::string("\x01\x00\x00\x00\xff\xff\xff\x7f", 8);
  EXPECT_TRUE(stranger_is_closed(host.port(), hello));
  host.set("k", bytes("v"));
  TcpStore client("127.0.0.1", host.port(), options("tok", false));
  EXPECT_EQ(client.get("k"), bytes("v"));
}

TEST(TcpStore, NoServerIsAClearErrorWithinTheTimeout) {
  StoreOptions o = options("tok", false);
  o.timeout = milliseconds(200);
  int free_port;
  {
    TcpStoreServer server("127.0.0.1", 0, "tok");
    free_port = server.port();
  }
  EXPECT_THROW(TcpStore("127.0.0.1", free_port, o), CommError);
}

}  // namespace
}  // namespace partrain::comm
