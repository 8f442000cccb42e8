// Connections that are not this run's ranks are refused, and the collective still completes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "comm_backends/backends/failure_trace.h"
#include "comm_backends/communicator.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/late_rank_ring.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;
namespace asio = boost::asio;

struct Stranger {
  asio::io_context io;
  asio::ip::tcp::socket socket{io};
};

TEST(RingStrangers, AreRefusedAndTheRingStillForms) {
  constexpr int kWorld = 3;
  const std::string token = "ring-token";
  // Ranks 1 and 2 start; rank 1 waits for its left neighbour, rank 0, which is late.
  testing::LateRankRing ring(kWorld, token, 5000);
  const std::string& host = ring.host();
  const int port = ring.port();

  // Before rank 0 shows up, four strangers knock on rank 1's door.
  const std::vector<std::string> knocks = {
      "GET / HTTP/1.1\r\n\r\n" + std::string(16, 'x'),    // garbage
      encode_peer_handshake(0, kWorld, "not-the-token"),  // wrong run token
      encode_peer_handshake(2, kWorld, token),            // a higher rank: rank 1 dials it
      encode_peer_handshake(0, kWorld + 1, token),        // another world size
      std::string(),                                      // connects, says nothing
  };
  std::vector<std::unique_ptr<Stranger>> strangers;
  for (const auto& knock : knocks) {
    auto s = std::make_unique<Stranger>();
    ASSERT_TRUE(net::connect_with_retry(s->io, s->socket, host, port,
                                        net::deadline_after(milliseconds(3000))));
    if (!knock.empty()) {
      ASSERT_TRUE(net::write_all(s->io, s->socket, knock.data(), knock.size(),
                                 net::deadline_after(milliseconds(3000)))
                      .ok());
    }
    strangers.push_back(std::move(s));
  }
  std::this_thread::sleep_for(milliseconds(100));
  ring.complete();

  // Every stranger was hung up on without an answer.
  for (std::size_t i = 0; i < strangers.size(); ++i) {
    char answer[8];
    auto result = net::read_exact(strangers[i]->io, strangers[i]->socket, answer, sizeof answer,
                                  net::deadline_after(milliseconds(5000)));
    EXPECT_EQ(result.status, net::IoStatus::closed) << "stranger " << i << ": " << result.message;
  }
}

TEST(RingStrangers, RanksThatDisagreeFailWithAMessage) {
  constexpr int kWorld = 2;
  testing::ScratchDir dir;
  std::vector<std::string> messages(kWorld);
  testing::run_ranks(kWorld, [&](int rank) {
    StoreOptions store_options;
    auto store = open_store(dir.url(), store_options);
    CommOptions options;
    options.backend = "asio-ring";
    options.timeout = milliseconds(5000);
    auto comm = make_communicator(options, *store, rank, kWorld);
    std::vector<float> data(rank == 0 ? 100 : 101, 1.0f);
    try {
      comm->allreduce(Buffer{data.data(), data.size(), DType::f32}, ReduceOp::sum);
    } catch (const CommError& e) {
      messages[rank] = e.what();
    }
    // The ring is now unusable, and says so instead of hanging.
    EXPECT_THROW(comm->barrier(), CommError);
  });
  bool explained = false;
  for (const auto& m : messages) explained |= m.find("disagree") != std::string::npos;
  EXPECT_TRUE(explained) << messages[0] << " | " << messages[1];
}

// Two asio-ring ranks as threads make their communicators; then rank `leaves` goes, its
// communicator destroyed while it unwinds from an error of its own or, without `unwinding`,
// quietly; with `why`, having said why it stopped in the store first (as a worker does,
// RankGroup::tell_stopped()). The other rank's first allreduce must fail: its error, which must
// come within 10 s (the deadline is 20 s).
std::string first_allreduce_after_a_rank_left(int leaves, bool unwinding,
                                              const std::string& why = "") {
  constexpr int kWorld = 2;
  testing::ScratchDir dir;
  StoreOptions store_options;
  std::unique_ptr<Store> stores[kWorld] = {open_store(dir.url(), store_options),
                                           open_store(dir.url(), store_options)};
  CommOptions options;
  options.backend = "asio-ring";
  options.timeout = milliseconds(20000);
  std::unique_ptr<Communicator> stays;
  testing::run_ranks(kWorld, [&](int rank) {
    if (rank != leaves) {
      stays = make_communicator(options, *stores[rank], rank, kWorld);
      return;
    }
    try {
      auto comm = make_communicator(options, *stores[rank], rank, kWorld);
      if (!why.empty()) {
        stores[rank]->set(rank_stopped_key(rank),
                          std::vector<std::uint8_t>(why.begin(), why.end()));
      }
      if (unwinding) throw Error("its data is missing");
    } catch (const Error&) {
    }
  });
  std::vector<float> data(100, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    stays->allreduce(Buffer{data.data(), data.size(), DType::f32}, ReduceOp::sum);
    ADD_FAILURE() << "the allreduce with a rank that left returned";
  } catch (const CommError& e) {
    error = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << error;
  return error;
}

// Rank 1 made its communicator (listening, its address published) and went away before the
// first collective, as a rank whose data is missing on its host does: rank 0, connecting to it,
// learns at once that nothing listens there any more, instead of retrying until the timeout.
TEST(RingStrangers, ARankGoneBeforeTheFirstCollectiveIsNamedAtOnce) {
  const std::string error = first_allreduce_after_a_rank_left(1, false);
  EXPECT_NE(error.find("cannot connect to rank 1: "), std::string::npos) << error;
  EXPECT_NE(error.find("the listener it published is gone"), std::string::npos) << error;
}

// Rank 0 made its communicator and left while unwinding from an error of its own, before it
// connected to rank 1 (the lower rank connects): rank 1, waiting for it, finds it gone in the
// store after a look's interval, not at the deadline.
TEST(RingStrangers, ARankThatLeftBeforeConnectingIsNamedByTheRankWaitingForIt) {
  const std::string error = first_allreduce_after_a_rank_left(0, true);
  EXPECT_NE(error.find("rank 0 left before it connected"), std::string::npos) << error;
}

// A rank that said why it stopped before its communicator closed is named with that reason,
// by the rank that found it gone in the store and by the one refused at its listener alike.
TEST(RingStrangers, ARankThatSaidWhyItStoppedIsNamedWithItsReason) {
  for (const int leaves : {0, 1}) {
    const std::string why =
        "rank " + std::to_string(leaves) + " (h) stopped: /data/train: no such folder";
    const std::string error = first_allreduce_after_a_rank_left(leaves, true, why);
    EXPECT_NE(error.find("; " + why), std::string::npos) << error;
    // The reason in place of the words that point to it.
    EXPECT_EQ(error.find(kItsOwnOutputSaysWhy), std::string::npos) << error;
  }
  const std::string quiet = first_allreduce_after_a_rank_left(1, true);
  EXPECT_EQ(quiet.find("stopped: "), std::string::npos) << quiet;
  const std::string unsaid = first_allreduce_after_a_rank_left(0, true);
  EXPECT_NE(unsaid.find(std::string("it failed") + kItsOwnOutputSaysWhy), std::string::npos)
      << unsaid;
}

// Rank 1 is played by a listener that publishes its address, takes rank 0's connection, reads
// its handshake and closes it without an answer: what a rank leaving does to a connection its
// listener queued, and what a listener refusing another run's token does. Rank 0's first
// message to it fails; its error, which must come well before the deadline.
std::string a_handshake_closed_by_rank_1(bool said_it_is_leaving) {
  testing::ScratchDir dir;
  StoreOptions store_options;
  store_options.timeout = milliseconds(5000);
  auto store = open_store(dir.url(), store_options);
  PeerTransportOptions options;
  options.token = "leaving-test";
  options.timeout = milliseconds(20000);

  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  const std::string published =
      encode_peer_address({"127.0.0.1:" + std::to_string(acceptor.local_endpoint().port()), ""});
  store->set(peer_address_key(options.key_prefix, 1),
             std::vector<std::uint8_t>(published.begin(), published.end()));
  if (said_it_is_leaving) store->set(peer_gone_key(options.key_prefix, 1), {1});
  std::thread rank1([&] {
    asio::ip::tcp::socket socket(io);
    acceptor.accept(socket);
    std::string hello(encode_peer_handshake(0, 2, options.token).size(), '\0');
    const auto read = net::read_exact(io, socket, hello.data(), hello.size(),
                                      net::deadline_after(milliseconds(5000)));
    EXPECT_TRUE(read.ok()) << read.message;
    socket.close();
  });

  PeerTransport transport(*store, 0, 2, options);
  CollectiveCall call;
  call.bytes = sizeof(std::uint64_t);
  call.kind = static_cast<std::uint8_t>(CollectiveKind::broadcast);
  transport.begin(call);
  std::uint64_t value = 7;
  PeerTransport::Transfer out;
  out.peer = 1;
  out.outgoing = true;
  out.data = &value;
  out.bytes = sizeof value;
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    transport.start(out);
    transport.wait(out);
    ADD_FAILURE() << "a message to a rank that closed our handshake was sent";
  } catch (const CommError& e) {
    error = e.what();
  }
  rank1.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << error;
  return error;
}

// A handshake closed by a rank that said, in the store, that it is leaving is named as that;
// one closed by a rank that said nothing is a refusal, as a stranger's listener gives.
TEST(RingStrangers, AHandshakeClosedByARankThatIsLeavingIsNamedAsLeaving) {
  const std::string leaving = a_handshake_closed_by_rank_1(true);
  EXPECT_NE(leaving.find("cannot connect to rank 1: 127.0.0.1:"), std::string::npos) << leaving;
  EXPECT_NE(leaving.find("closed the connection during our handshake: that rank is leaving"),
            std::string::npos)
      << leaving;
  EXPECT_EQ(leaving.find("refused our handshake"), std::string::npos) << leaving;

  const std::string refused = a_handshake_closed_by_rank_1(false);
  EXPECT_NE(refused.find("rank 1 at 127.0.0.1:"), std::string::npos) << refused;
  EXPECT_NE(refused.find("refused our handshake (another run, or a different token?)"),
            std::string::npos)
      << refused;
  EXPECT_EQ(refused.find("is leaving"), std::string::npos) << refused;
}

// Without the promise that the peer listened before it published (a store server that may not
// be up yet), a refused connection is tried again until the deadline.
TEST(RingStrangers, ARefusedConnectionIsRetriedUnlessThePeerListenedFirst) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  const int port = acceptor.local_endpoint().port();
  acceptor.close();
  asio::ip::tcp::socket socket(io);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(net::connect_with_retry(io, socket, "127.0.0.1", port,
                                       net::deadline_after(milliseconds(300))));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300));
  net::SocketTuning gone;
  gone.listened_before_publishing = true;
  EXPECT_THROW(net::connect_with_retry(io, socket, "127.0.0.1", port,
                                       net::deadline_after(milliseconds(20000)), gone),
               CommError);
}

}  // namespace
}  // namespace partrain::comm
