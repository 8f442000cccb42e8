// Strangers on the tcp store port and on a ring port — a huge length prefix, a connection
// that stops halfway (silent, or with its sending side shut), many idle connections — are
// dropped without an answer, and the store and the ring keep working for the run.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>

#include "comm_backends/communicator.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/store/store.h"
#include "comm_backends/store/tcp_store.h"
#include "common/byte_codec.h"
#include "common/errors.h"
#include "tests/support/late_rank_ring.h"
#include "tests/support/rank_threads.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;
namespace asio = boost::asio;

std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

void put_u32(std::string& s, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
}

// One connection that says `payload` and then either stays silent or shuts its sending side.
struct Stranger {
  asio::io_context io;
  asio::ip::tcp::socket socket{io};

  Stranger(int port, const std::string& payload, bool shut_send) {
    const auto deadline = net::deadline_after(milliseconds(3000));
    EXPECT_TRUE(net::connect_with_retry(io, socket, "127.0.0.1", port, deadline));
    if (!payload.empty()) {
      EXPECT_TRUE(net::write_all(io, socket, payload.data(), payload.size(), deadline).ok());
    }
    if (shut_send) {
      boost::system::error_code ignored;
      socket.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    }
  }

  // Waits for the peer to hang up; returns how long that took, or -1 when it answered
  // something or did not hang up within `bound`.
  double seconds_until_closed(milliseconds bound) {
    const auto start = net::Clock::now();
    char answer[8];
    auto result = net::read_exact(io, socket, answer, sizeof answer, start + bound);
    if (result.status != net::IoStatus::closed) return -1;
    return std::chrono::duration<double>(net::Clock::now() - start).count();
  }
};

StoreOptions store_options(const std::string& token, bool host) {
  StoreOptions o;
  o.token = token;
  o.timeout = milliseconds(3000);
  o.host_server = host;
  return o;
}

std::string store_hello(std::uint32_t token_bytes) {
  std::string hello(kStoreHelloBytes, '\0');
  std::memcpy(hello.data(), kStoreMagic, 8);
  put_u32(hello, 8, kStoreProtocolVersion);
  put_u32(hello, 12, token_bytes);
  return hello;
}

TEST(TcpStorePortStrangers, HugeLengthPrefixesAreDroppedAtOnce) {
  TcpStore host("127.0.0.1", 0, store_options("tok", true));
  // A token length just over the bound: dropped on reading the hello, not after a timeout.
  Stranger long_token(host.port(), store_hello(kMaxTokenBytes + 1), false);
  const double token_seconds = long_token.seconds_until_closed(milliseconds(5000));
  EXPECT_GE(token_seconds, 0.0);
  EXPECT_LT(token_seconds, 2.0);

  // A client of this run whose request announces 4 GiB keys or values is cut off before
  // anything of that size is allocated; the next request on that connection fails clearly.
  for (const auto& [key_bytes, value_bytes] :
       {std::pair<std::uint32_t, std::uint32_t>{0xffffffffu, 1},
        {1, 0xffffffffu},
        {kMaxKeyBytes + 1, 0},
        {1, kMaxValueBytes + 1}}) {
    std::string conversation = store_hello(3) + "tok";
    std::string request(kStoreRequestBytes, '\0');
    request[0] = 1;  // set
    put_u32(request, 1, key_bytes);
    put_u32(request, 5, value_bytes);
    Stranger member(host.port(), conversation, false);
    char accept[8];
    ASSERT_TRUE(net::read_exact(member.io, member.socket, accept, 8,
                                net::deadline_after(milliseconds(3000)))
                    .ok());
    ASSERT_EQ(std::memcmp(accept, kStoreAccept, 8), 0);
    std::uint8_t length[4] = {};  // then the server's clock identity
    ASSERT_TRUE(net::read_exact(member.io, member.socket, length, 4,
                                net::deadline_after(milliseconds(3000)))
                    .ok());
    std::string clock(get_le<std::uint32_t>(length), '\0');
    ASSERT_TRUE(net::read_exact(member.io, member.socket, clock.data(), clock.size(),
                                net::deadline_after(milliseconds(3000)))
                    .ok());
    ASSERT_TRUE(net::write_all(member.io, member.socket, request.data(), request.size(),
                               net::deadline_after(milliseconds(3000)))
                    .ok());
    const double seconds = member.seconds_until_closed(milliseconds(5000));
    EXPECT_GE(seconds, 0.0) << key_bytes << "/" << value_bytes << " was not dropped";
    EXPECT_LT(seconds, 2.0);
  }

  TcpStore client("127.0.0.1", host.port(), store_options("tok", false));
  client.set("after", bytes("strangers"));
  EXPECT_EQ(host.get("after"), bytes("strangers"));
  std::cout << "[measure] tcp store: oversized token length dropped after " << token_seconds
            << " s\n";
}

TEST(TcpStorePortStrangers, HalfOpenConnectionsDoNotBlockTheStore) {
  TcpStore host("127.0.0.1", 0, store_options("tok", true));
  // Half a hello then silence; half a hello then the sending side shut; 50 idle connections.
  Stranger silent(host.port(), store_hello(3).substr(0, 10), false);
  Stranger shut(host.port(), store_hello(3).substr(0, 10), true);
  Stranger token_cut(host.port(), store_hello(3) + "to", false);
  std::vector<std::unique_ptr<Stranger>> idle;
  for (int i = 0; i < 50; ++i) idle.push_back(std::make_unique<Stranger>(host.port(), "", false));

  // Meanwhile ranks of the run connect and work as usual, and quickly.
  const auto start = net::Clock::now();
  testing::run_ranks(4, [&](int rank) {
    TcpStore client("127.0.0.1", host.port(), store_options("tok", false));
    client.add("arrived", 1);
    client.set("rank/" + std::to_string(rank), bytes("here"));
    client.wait({"rank/0", "rank/1", "rank/2", "rank/3"}, milliseconds(3000));
  });
  const double busy_seconds = std::chrono::duration<double>(net::Clock::now() - start).count();
  EXPECT_EQ(host.add("arrived", 0), 4);
  EXPECT_LT(busy_seconds, 2.0);

  // The shut one goes at once; the silent ones when the hello timeout (10 s) passes.
  const double shut_seconds = shut.seconds_until_closed(milliseconds(5000));
  EXPECT_GE(shut_seconds, 0.0);
  EXPECT_LT(shut_seconds, 2.0);
  const double silent_seconds = silent.seconds_until_closed(milliseconds(15000));
  EXPECT_GE(silent_seconds, 0.0) << "a silent half-open connection was never dropped";
  EXPECT_GE(token_cut.seconds_until_closed(milliseconds(5000)), 0.0);
  for (auto& s : idle) EXPECT_GE(s->seconds_until_closed(milliseconds(5000)), 0.0);
  std::cout << "[measure] tcp store: run of 4 clients beside 53 strangers took " << busy_seconds
            << " s; shut half-open dropped after " << shut_seconds
            << " s; silent half-open dropped after " << silent_seconds << " s more\n";
}

TEST(RingPortStrangers, HugeLengthPrefixAndHalfOpenConnectionsAreRefused) {
  constexpr int kWorld = 3;
  const std::string token = "ring-token";
  // Ranks 1 and 2 start; rank 1 waits for rank 0, which comes after the strangers.
  testing::LateRankRing ring(kWorld, token, 3000);
  const int port = ring.port();

  const std::string right = encode_peer_handshake(0, kWorld, token);
  std::string huge = right.substr(0, kPeerHandshakeBytes);
  put_u32(huge, 20, 0xffffffffu);  // a 4 GiB token announced, nothing sent
  Stranger huge_prefix(port, huge, false);
  Stranger silent(port, right.substr(0, 10), false);
  Stranger shut(port, right.substr(0, 10), true);
  Stranger token_cut(port, right.substr(0, right.size() - 3), false);

  // The refusable ones are refused while the ring still waits for rank 0.
  const double huge_seconds = huge_prefix.seconds_until_closed(milliseconds(3000));
  EXPECT_GE(huge_seconds, 0.0);
  EXPECT_LT(huge_seconds, 2.0);
  const double shut_seconds = shut.seconds_until_closed(milliseconds(3000));
  EXPECT_GE(shut_seconds, 0.0);
  EXPECT_LT(shut_seconds, 2.0);

  ring.complete();
  // The ones that stopped halfway are hung up on once the ring has formed.
  EXPECT_GE(silent.seconds_until_closed(milliseconds(5000)), 0.0);
  EXPECT_GE(token_cut.seconds_until_closed(milliseconds(5000)), 0.0);
  std::cout << "[measure] ring port: huge token length refused after " << huge_seconds
            << " s, shut half-open after " << shut_seconds << " s\n";
}

}  // namespace
}  // namespace partrain::comm
