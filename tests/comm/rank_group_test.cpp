// open_rank_group(): the store, the hosts learned once, and communicators over them, as
// `partrain worker` and `partrain bench` open their ranks.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm_backends/rank_group.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

TEST(RankGroup, OneRankWithoutARendezvousMeetsInADirectoryOfItsOwn) {
  RankGroupOptions options;
  options.timeout = milliseconds(10000);
  auto group = open_rank_group(options);
  EXPECT_EQ(group->size(), 1);
  ASSERT_EQ(group->layout().host_count(), 1u);
  group->store().set("probe", {7});
  EXPECT_EQ(group->store().get("probe"), std::vector<std::uint8_t>{7});
  CommOptions comm_options = group->comm_options();
  EXPECT_EQ(comm_options.timeout, milliseconds(10000));
  EXPECT_EQ(comm_options.bind_host, group->bind_host());
  auto comm = group->make_communicator(comm_options);
  EXPECT_EQ(comm->name(), "asio-ring");  // auto with one rank
  double x = 2.5;
  comm->allreduce(Buffer{&x, 1, DType::f64}, ReduceOp::sum);
  EXPECT_EQ(x, 2.5);
}

TEST(RankGroup, SeveralRanksWithoutARendezvousAreRefused) {
  RankGroupOptions options;
  options.world_size = 2;
  EXPECT_THROW(open_rank_group(options), UsageError);
}

// Three ranks on this host: the group sees one host, auto takes shm, and every communicator
// of the group (auto and named ones) runs over the same store.
TEST(RankGroup, CommunicatorsOfAGroupShareItsHostsAndStore) {
  constexpr int kWorld = 3;
  testing::ScratchDir dir;
  std::vector<std::string> auto_names(kWorld), bind_hosts(kWorld);
  std::vector<std::vector<double>> sums(kWorld);
  testing::run_ranks(kWorld, [&](int rank) {
    RankGroupOptions options;
    options.rendezvous = dir.url();
    options.token = "group-test";
    options.rank = rank;
    options.world_size = kWorld;
    options.local_world_size = kWorld;
    options.timeout = milliseconds(20000);
    options.host = "127.0.0.1";
    auto group = open_rank_group(options);
    ASSERT_EQ(group->layout().host_count(), 1u);
    ASSERT_EQ(group->layout().members(0), (std::vector<int>{0, 1, 2}));
    bind_hosts[rank] = group->bind_host();
    CommOptions comm_options = group->comm_options();
    auto automatic = group->make_communicator(comm_options);
    auto_names[rank] = automatic->name();
    comm_options.backend = "asio-ring";
    auto ring = group->make_communicator(comm_options);
    for (Communicator* comm : {automatic.get(), ring.get()}) {
      double x = rank + 1;
      comm->allreduce(Buffer{&x, 1, DType::f64}, ReduceOp::sum);
      sums[rank].push_back(x);
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(auto_names[r], "shm") << "rank " << r;
    EXPECT_EQ(bind_hosts[r], "127.0.0.1") << "rank " << r;
    EXPECT_EQ(sums[r], (std::vector<double>{6, 6})) << "rank " << r;
  }
}

}  // namespace
}  // namespace partrain::comm
