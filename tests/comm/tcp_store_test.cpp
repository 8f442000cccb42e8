#include "comm_backends/store/tcp_store.h"
#include "comm_backends/shm/host_identity.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "common/byte_codec.h"

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

// A node whose command differs from the master's is refused and stops at once; the host, whose
// ranks wait for it, names where it came from once, and again when a wait times out. A
// stranger that is no partrain client is not named.
TEST(TcpStore, AHostNamesTheClientsItRefusedForAnotherRunsToken) {
  TcpStore host("127.0.0.1", 0, options("right", true));
  EXPECT_EQ(host.server()->refused_clients(), std::vector<std::string>{});
  EXPECT_TRUE(stranger_is_closed(host.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  for (int i = 0; i < 2; ++i) {
    EXPECT_THROW(TcpStore("127.0.0.1", host.port(), options("wrong", false)), UsageError);
  }
  EXPECT_EQ(host.server()->refused_clients(), std::vector<std::string>{"127.0.0.1"});
  host.set_timeout(milliseconds(100));
  for (const auto& wait : std::vector<std::function<void()>>{
           [&] { host.get("never"); }, [&] { host.wait({"never"}, milliseconds(100)); },
           [&] {
             host.get_many({"never", "nor"});
           }}) {
    try {
      wait();
      ADD_FAILURE() << "a key nobody set was found";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("meanwhile it refused partrain processes with "
                                           "another run's token, from 127.0.0.1 (a node whose "
                                           "command differs"),
                std::string::npos)
          << e.what();
    }
  }
  // A client of the run, not hosting the server, cannot tell.
  TcpStore client("127.0.0.1", host.port(), options("right", false));
  client.set_timeout(milliseconds(100));
  try {
    client.get("never");
    ADD_FAILURE() << "a key nobody set was found";
  } catch (const CommError& e) {
    EXPECT_EQ(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
}

// A partrain process that could not join (a node that could not read its config) tells the
// server one line without a token: kept once, said on stderr at once, answered, and named at the
// end of the hosting store's timeouts. A client of the run is told nothing, and a notice too
// long for the protocol is closed unread.
TEST(TcpStore, ANodeThatCouldNotStartIsHeardWithoutAToken) {
  TcpStore host("127.0.0.1", 0, options("right", true));
  EXPECT_EQ(host.notices(), std::vector<std::string>{});
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(tell_tcp_store("127.0.0.1", host.port(),
                             "node 1 (h7) could not start its ranks: a.yaml:\ncannot open",
                             milliseconds(5000)));
  const std::string said = ::testing::internal::GetCapturedStderr();
  const std::string line = "node 1 (h7) could not start its ranks: a.yaml: cannot open";
  EXPECT_EQ(host.notices(), std::vector<std::string>{line});
  EXPECT_EQ(host.server()->notices(), std::vector<std::string>{line});
  EXPECT_NE(said.find("partrain: tcp store on port " + std::to_string(host.port()) +
                      ": the partrain process at 127.0.0.1 says: " + line + "\n"),
            std::string::npos)
      << said;
  std::string hello(kStoreNoticeMagic, 8);
  hello += std::string("\x04\x00\x00\x00\x01\x08\x00\x00", 8);  // 2049 bytes
  EXPECT_TRUE(stranger_is_closed(host.port(), hello));
  EXPECT_EQ(host.notices().size(), 1u);
  host.set_timeout(milliseconds(100));
  try {
    host.get("never");
    ADD_FAILURE() << "a key nobody set was found";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("; meanwhile it was told: " + line), std::string::npos)
        << e.what();
  }
  TcpStore client("127.0.0.1", host.port(), options("right", false));
  EXPECT_EQ(client.notices(), std::vector<std::string>{});
  // Nobody listening: the teller gives up at its bound, without an error.
  int closed_port = 0;
  {
    TcpStore gone("127.0.0.1", 0, options("x", true));
    closed_port = gone.port();
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(tell_tcp_store("127.0.0.1", closed_port, "nobody hears this", milliseconds(300)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

// A master node that could not start stands in for its store: every client, whatever its token,
// stops with the line (a UsageError, exit 2), and the stand-in counts whom it told.
TEST(TcpStore, AStandInForAMasterThatCouldNotStartTellsEveryClientWhy) {
  const std::string line = "node 0 (h0) could not start its ranks: a.yaml: cannot open";
  TcpStoreServer stand_in("127.0.0.1", 0, "", line);
  EXPECT_EQ(stand_in.told_clients(), 0u);
  EXPECT_FALSE(stand_in.last_heard());
  for (const char* token : {"run", "another", "joining"}) {
    try {
      StoreOptions o = options(token, false);
      if (std::string(token) == "joining") o.join_key = "ranks/process/0";  // a join's hello
      TcpStore client("127.0.0.1", stand_in.port(), o);
      ADD_FAILURE() << "a stand-in served a client";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                "the master at 127.0.0.1:" + std::to_string(stand_in.port()) + " says: " + line);
    }
  }
  EXPECT_EQ(stand_in.told_clients(), 3u);
  ASSERT_TRUE(stand_in.last_heard());
  EXPECT_LE(*stand_in.last_heard(), std::chrono::steady_clock::now());
}

// A key set as a client joins rides in its hello: there for the others at once, no request
// of its own; a join with another run's token is refused as a hello is, and sets nothing.
TEST(TcpStore, AKeySetAsAClientJoinsCostsNoRequest) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  const std::uint64_t before = host.server()->requests_served();
  StoreOptions joining = options("tok", false);
  joining.join_key = "ranks/process/1";
  joining.join_value = bytes("pid=42");
  TcpStore client("127.0.0.1", host.port(), joining);
  EXPECT_EQ(host.server()->requests_served(), before);
  EXPECT_EQ(host.get("ranks/process/1"), bytes("pid=42"));
  client.set("after", bytes("works"));
  EXPECT_EQ(host.get("after"), bytes("works"));

  StoreOptions intruder = options("wrong", false);
  intruder.join_key = "ranks/process/2";
  intruder.join_value = bytes("pid=43");
  EXPECT_THROW(TcpStore("127.0.0.1", host.port(), intruder), UsageError);
  EXPECT_FALSE(host.check({"ranks/process/2"}));

  StoreOptions too_big = options("tok", false);
  too_big.join_key = "k";
  too_big.join_value.resize(kMaxJoinValueBytes + 1);
  EXPECT_THROW(TcpStore("127.0.0.1", host.port(), too_big), UsageError);
}

TEST(TcpStore, AJoinsPayloadReadsBackAndABadOneIsRefused) {
  const StoreJoin join{"tok", "ranks/process/3", bytes("pid=7 started=9")};
  const std::vector<std::uint8_t> payload = store_join_payload(join);
  const auto back = parse_store_join_payload(payload);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->token, join.token);
  EXPECT_EQ(back->key, join.key);
  EXPECT_EQ(back->value, join.value);
  EXPECT_TRUE(parse_store_join_payload(store_join_payload({"", "k", {}})).has_value());
  // Cut short anywhere inside its lengths, token or key; an empty key; a value over the limit.
  for (std::size_t cut = 0; cut < 4 + join.token.size() + 4 + join.key.size(); ++cut) {
    const std::vector<std::uint8_t> short_one(payload.begin(),
                                              payload.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_FALSE(parse_store_join_payload(short_one).has_value()) << cut;
  }
  EXPECT_FALSE(parse_store_join_payload(store_join_payload({"tok", "", bytes("v")})).has_value());
  EXPECT_FALSE(
      parse_store_join_payload(
          store_join_payload({"tok", "k", std::vector<std::uint8_t>(kMaxJoinValueBytes + 1)}))
          .has_value());
  std::vector<std::uint8_t> lying = payload;
  put_le<std::uint32_t>(lying.data(), 0xffffffffu);  // a token length past the end
  EXPECT_FALSE(parse_store_join_payload(lying).has_value());
}

TEST(TcpStore, StrangersWithGarbageAreDisconnectedAndStoreKeepsWorking) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  EXPECT_TRUE(stranger_is_closed(host.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  // Right magic, absurd token length: refused before anything is allocated.
  std::string hello(kStoreMagic, 8);
  hello += std::string("\x02\x00\x00\x00\xff\xff\xff\x7f", 8);
  EXPECT_TRUE(stranger_is_closed(host.port(), hello));
  host.set("k", bytes("v"));
  TcpStore client("127.0.0.1", host.port(), options("tok", false));
  EXPECT_EQ(client.get("k"), bytes("v"));
}

// Every client learns at its hello which process serves the store: whom it serves as, and its
// mark, so that a client of its machine can see what it does once it no longer answers.
TEST(TcpStore, EveryClientIsToldWhichProcessServesIt) {
  StoreOptions hosting = options("tok", true);
  hosting.rank = 0;
  TcpStore host("127.0.0.1", 0, hosting);
  TcpStore client("127.0.0.1", host.port(), options("tok", false));
  const auto server = client.server_process();
  ASSERT_TRUE(server.has_value());
  EXPECT_EQ(server->role, "rank 0");
  EXPECT_EQ(decode_process_mark(server->mark), this_process());

  TcpStoreServer unnamed("127.0.0.1", 0, "tok");
  TcpStore its_client("127.0.0.1", unnamed.port(), options("tok", false));
  ASSERT_TRUE(its_client.server_process().has_value());
  EXPECT_EQ(its_client.server_process()->role, "");

  // The answer's text, and a server's that says only its clock.
  const StoreAcceptText about =
      parse_store_accept_text(store_accept_text("boot x", {"rank 3", "pid=7 started=9"}));
  EXPECT_EQ(about.clock, "boot x");
  ASSERT_TRUE(about.server.has_value());
  EXPECT_EQ(about.server->role, "rank 3");
  EXPECT_EQ(about.server->mark, "pid=7 started=9");
  EXPECT_FALSE(parse_store_accept_text("boot x").server.has_value());
  EXPECT_EQ(parse_store_accept_text("boot x").clock, "boot x");
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

// A connection that has passed the hello: requests can be written to it by hand.
struct RawClient {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket socket{io};
  RawClient(int port, const std::string& token) {
    const auto deadline = net::deadline_after(milliseconds(3000));
    EXPECT_TRUE(net::connect_with_retry(io, socket, "127.0.0.1", port, deadline));
    std::vector<std::uint8_t> hello(kStoreHelloBytes);
    std::memcpy(hello.data(), kStoreMagic, 8);
    put_le<std::uint32_t>(hello.data() + 8, kStoreProtocolVersion);
    put_le<std::uint32_t>(hello.data() + 12, static_cast<std::uint32_t>(token.size()));
    hello.insert(hello.end(), token.begin(), token.end());
    EXPECT_TRUE(net::write_all(io, socket, hello.data(), hello.size(), deadline).ok());
    char answer[8] = {};
    EXPECT_TRUE(net::read_exact(io, socket, answer, 8, deadline).ok());
    EXPECT_EQ(std::memcmp(answer, kStoreAccept, 8), 0);
    std::uint8_t length[4] = {};  // then what the server says of itself
    EXPECT_TRUE(net::read_exact(io, socket, length, 4, deadline).ok());
    std::string about(get_le<std::uint32_t>(length), '\0');
    EXPECT_TRUE(net::read_exact(io, socket, about.data(), about.size(), deadline).ok());
    EXPECT_EQ(parse_store_accept_text(about).clock, steady_clock_identity());
  }
  void send(StoreCommand command, const std::string& key, const std::vector<std::uint8_t>& value) {
    std::vector<std::uint8_t> message(kStoreRequestBytes);
    message[0] = static_cast<std::uint8_t>(command);
    put_le<std::uint32_t>(message.data() + 1, static_cast<std::uint32_t>(key.size()));
    put_le<std::uint32_t>(message.data() + 5, static_cast<std::uint32_t>(value.size()));
    message.insert(message.end(), key.begin(), key.end());
    message.insert(message.end(), value.begin(), value.end());
    EXPECT_TRUE(net::write_all(io, socket, message.data(), message.size(),
                               net::deadline_after(milliseconds(3000)))
                    .ok());
  }
};

TEST(TcpStore, AWaitIsOneRequestAnsweredWhenTheKeyIsSet) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  TcpStore client("127.0.0.1", host.port(), options("tok", false));
  const std::uint64_t before = host.server()->requests_served();
  std::vector<std::uint8_t> got;
  std::thread waiter([&] { got = client.get("later"); });
  // Long enough for a polling client to ask many times; the server holds one request.
  std::this_thread::sleep_for(milliseconds(400));
  host.set("later", bytes("v"));
  waiter.join();
  EXPECT_EQ(got, bytes("v"));
  EXPECT_EQ(host.server()->requests_served() - before, 2u);  // the set and the one wait
  // A wait that times out is answered so, naming the key, and the connection stays usable.
  try {
    client.wait({"later", "never"}, milliseconds(100));
    FAIL() << "a wait for a key nobody sets returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'never' did not appear within 100 ms"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(client.get("later"), bytes("v"));
}

// A get many is one request, answered once the last of its keys is set, with the values in
// the order asked (an empty one too); a timeout names a key still missing.
TEST(TcpStore, GetManyIsOneRequestAnsweredWhenItsLastKeyIsSet) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  TcpStore client("127.0.0.1", host.port(), options("tok", false));
  host.set("b", bytes("two"));
  const std::uint64_t before = host.server()->requests_served();
  std::vector<std::vector<std::uint8_t>> got;
  std::thread waiter([&] { got = client.get_many({"a", "b", "c", "d"}); });
  std::this_thread::sleep_for(milliseconds(200));
  host.set("c", {});
  host.set("a", bytes("one"));
  std::this_thread::sleep_for(milliseconds(100));
  host.set("d", bytes("four"));
  waiter.join();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], bytes("one"));
  EXPECT_EQ(got[1], bytes("two"));
  EXPECT_TRUE(got[2].empty());
  EXPECT_EQ(got[3], bytes("four"));
  EXPECT_EQ(host.server()->requests_served() - before, 4u);  // three sets and the get many
  // All there already: answered at once, and the connection goes on.
  EXPECT_EQ(client.get_many({"d", "a"}),
            (std::vector<std::vector<std::uint8_t>>{bytes("four"), bytes("one")}));
  EXPECT_TRUE(client.get_many({}).empty());
  TcpStore impatient("127.0.0.1", host.port(), options("tok", false));
  impatient.set_timeout(milliseconds(100));
  try {
    impatient.get_many({"a", "never", "b"});
    FAIL() << "a get many of a key nobody sets returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'never' did not appear within 100 ms"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(impatient.get("a"), bytes("one"));
}

// Every answer carries the server's steady clock: here, in the same process, within the round
// trip of this thread's own. A reading costs a request only when the answers so far are fewer
// than asked for.
TEST(TcpStore, EveryAnswerIsAReadingOfTheServersClock) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  StoreOptions remote = options("tok", false);
  remote.read_shared_clock_here = false;  // as a client on another host reads it
  TcpStore client("127.0.0.1", host.port(), remote);
  const auto ns = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  for (int i = 0; i < 3; ++i) client.set("k" + std::to_string(i), bytes("v"));
  const std::uint64_t served = host.server()->requests_served();
  const std::optional<ServerClockReading> three = client.server_clock(3);
  EXPECT_EQ(host.server()->requests_served(), served);  // the sets' answers were readings
  ASSERT_TRUE(three.has_value());
  EXPECT_GE(three->server_ns, ns(three->sent));
  EXPECT_LE(three->server_ns, ns(three->received));
  const std::optional<ServerClockReading> five = client.server_clock(5);
  EXPECT_EQ(host.server()->requests_served(), served + 2);
  ASSERT_TRUE(five.has_value());
  EXPECT_LE(five->round_trip(), three->round_trip());  // the best of more readings
  EXPECT_GE(five->server_ns, ns(five->sent));
  EXPECT_LE(five->server_ns, ns(five->received));

  // A client on the server's own clock reads it at once, without a request.
  TcpStore local("127.0.0.1", host.port(), options("tok", false));
  const std::uint64_t before = host.server()->requests_served();
  const std::optional<ServerClockReading> here = local.server_clock(8);
  EXPECT_EQ(host.server()->requests_served(), before);
  ASSERT_TRUE(here.has_value());
  EXPECT_EQ(here->round_trip(), std::chrono::steady_clock::duration::zero());
  EXPECT_EQ(here->server_ns, ns(here->sent));
}

TEST(TcpStore, AClientStartedBeforeItsServerConnectsWithinItsTimeout) {
  int port;
  {
    TcpStoreServer probe("127.0.0.1", 0, "tok");
    port = probe.port();
  }
  std::unique_ptr<TcpStoreServer> server;
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port, "tok");
  });
  StoreOptions o = options("tok", false);
  o.timeout = milliseconds(5000);
  TcpStore early("127.0.0.1", port, o);  // refused at first: retried until the server listens
  late.join();
  early.set("k", bytes("v"));
  EXPECT_EQ(early.get("k"), bytes("v"));
}

TEST(TcpStore, ClientsThatStallOrLeaveMidWaitHoldUpNobody) {
  TcpStore host("127.0.0.1", 0, options("tok", true));
  host.set("big", std::vector<std::uint8_t>(8u << 20, 7));
  // One client asks for 8 MiB over and over and never reads an answer: the server's writes
  // to it stall once the socket buffers fill.
  RawClient greedy(host.port(), "tok");
  for (int i = 0; i < 8; ++i) greedy.send(StoreCommand::get, "big", {});
  // One sends half a request header and stops; one parks in a wait and goes away.
  RawClient halfway(host.port(), "tok");
  const std::uint8_t half[4] = {2, 3, 0, 0};
  net::write_all(halfway.io, halfway.socket, half, sizeof half,
                 net::deadline_after(milliseconds(1000)));
  {
    RawClient leaver(host.port(), "tok");
    std::vector<std::uint8_t> wait(kStoreWaitBytes, 0);
    put_le<std::uint32_t>(wait.data(), 60000);
    leaver.send(StoreCommand::wait, "never", wait);
  }
  // Everyone else still rendezvouses, well inside their timeout.
  testing::run_ranks(8, [&](int rank) {
    TcpStore client("127.0.0.1", host.port(), options("tok", false));
    client.set("r" + std::to_string(rank), bytes("x"));
    EXPECT_EQ(client.get("r" + std::to_string((rank + 1) % 8)), bytes("x"));
    client.add("arrived", 1);
  });
  EXPECT_EQ(host.add("arrived", 0), 8);
}

}  // namespace
}  // namespace partrain::comm
