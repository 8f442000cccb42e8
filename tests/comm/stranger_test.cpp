// Connections that are not this run's ranks are refused, and the collective still completes.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

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

// Rank 1 made its communicator (listening, its address published) and went away before the
// first collective, as a rank whose data is missing on its host does: rank 0, connecting to it,
// learns at once that nothing listens there any more, instead of retrying until the timeout.
TEST(RingStrangers, ARankGoneBeforeTheFirstCollectiveIsNamedAtOnce) {
  constexpr int kWorld = 2;
  testing::ScratchDir dir;
  StoreOptions store_options;
  auto store0 = open_store(dir.url(), store_options);
  auto store1 = open_store(dir.url(), store_options);
  CommOptions options;
  options.backend = "asio-ring";
  options.timeout = milliseconds(20000);
  std::unique_ptr<Communicator> comm0;
  testing::run_ranks(kWorld, [&](int rank) {
    if (rank == 0) comm0 = make_communicator(options, *store0, 0, kWorld);
    if (rank == 1) make_communicator(options, *store1, 1, kWorld).reset();  // made, then gone
  });
  std::vector<float> data(100, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  try {
    comm0->allreduce(Buffer{data.data(), data.size(), DType::f32}, ReduceOp::sum);
    ADD_FAILURE() << "the allreduce with a rank that is gone returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot connect to rank 1: "), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("the listener it published is gone"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
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
