// What a rendezvous asks of the store: the host layout and the barrier grow by a few requests
// a rank (counted at the tcp store's server), and a rank that never comes is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm_backends/placement.h"
#include "comm_backends/shm/host_identity.h"
#include "comm_backends/store/store_barrier.h"
#include "comm_backends/store/tcp_store.h"
#include "common/byte_codec.h"
#include "common/cpu_list.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

StoreOptions options(bool host, milliseconds timeout = milliseconds(5000)) {
  StoreOptions o;
  o.token = "tok";
  o.timeout = timeout;
  o.host_server = host;
  return o;
}

TEST(Rendezvous, HostLayoutAndBarrierCostAFewRequestsARank) {
  constexpr int kWorld = 32;
  TcpStore host("127.0.0.1", 0, options(true));
  testing::run_ranks(kWorld, [&](int rank) {
    TcpStore store("127.0.0.1", host.port(), options(false));
    const HostLayout layout = exchange_host_layout(store, kHostLayoutPrefix, rank, kWorld);
    EXPECT_EQ(layout.ranks(), kWorld);
    ASSERT_EQ(layout.host_count(), 1u);  // threads of one process: one host
    EXPECT_EQ(layout.identities[0], host_identity());
    store_barrier(store, "test/barrier", rank, kWorld, milliseconds(5000));
  });
  // Layout: W sets, rank 0's one get many of its group and one set, W-1 reads of it (2W + 1);
  // barrier: a set, an add and at most a wait a rank (3W). Every rank reading every other's
  // host would be W*W = 1024 requests for the layout alone.
  EXPECT_LE(host.server()->requests_served(), 5u * kWorld + 1);
}

TEST(Rendezvous, ARankThatNeverPublishesItsHostIsNamedOnEveryRank) {
  constexpr int kWorld = 3;
  TcpStore host("127.0.0.1", 0, options(true));
  testing::run_ranks(kWorld - 1, [&](int rank) {
    TcpStore store("127.0.0.1", host.port(), options(false, milliseconds(300)));
    try {
      exchange_host_layout(store, kHostLayoutPrefix, rank, kWorld);
      FAIL() << "rank " << rank << " learned a layout without rank 2";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank(s) 2 never published their host"),
                std::string::npos)
          << e.what();
    }
  });
}

// Gathered in two levels (leaders 0, 4, 8 of groups of four), the layout is the same, the
// requests stay a few a rank, and a rank missing from a group other than rank 0's is named
// by every rank that waits on it.
TEST(Rendezvous, TheLayoutGatheredInGroupsIsTheSame) {
  constexpr int kWorld = 10;
  constexpr int kFanIn = 4;
  TcpStore host("127.0.0.1", 0, options(true));
  testing::run_ranks(kWorld, [&](int rank) {
    TcpStore store("127.0.0.1", host.port(), options(false));
    const HostLayout layout = exchange_host_layout(store, kHostLayoutPrefix, rank, kWorld, kFanIn);
    EXPECT_EQ(layout.ranks(), kWorld);
    ASSERT_EQ(layout.host_count(), 1u);
    EXPECT_EQ(layout.host_sizes[0], kWorld);
    EXPECT_EQ(layout.identities[0], host_identity());
    // Every rank's CPUs came through the groups' values: the union of the same set.
    EXPECT_EQ(layout.host_cpus[0], distinct_cpus({cpu_affinity()}));
  });
  // W sets and W-1 reads of the layout; a get many by each of the three leaders, two group
  // sets, rank 0's get many of the two groups; the layout's set: 2W + 7.
  EXPECT_LE(host.server()->requests_served(), 2u * kWorld + 7);

  TcpStore second("127.0.0.1", 0, options(true));
  testing::run_ranks(kWorld, [&](int rank) {
    if (rank == 6) return;  // never arrives: its leader (4) and rank 0 both time out
    TcpStore store("127.0.0.1", second.port(), options(false, milliseconds(300)));
    try {
      exchange_host_layout(store, kHostLayoutPrefix, rank, kWorld, kFanIn);
      FAIL() << "rank " << rank << " learned a layout without rank 6";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank(s) 6 never published their host"),
                std::string::npos)
          << e.what();
    }
  });
  TcpStore store("127.0.0.1", 0, options(true));
  EXPECT_THROW(exchange_host_layout(store, kHostLayoutPrefix, 0, kWorld, 1), UsageError);
}

// A value laid out as builds before the format mark laid a rank's site: the host, the CPUs,
// the room for shared memory, with nothing before them.
std::vector<std::uint8_t> unmarked_site(const std::string& host) {
  std::vector<std::uint8_t> out(4 + host.size() + 4 + 1 + 8);
  put_le<std::uint32_t>(out.data(), static_cast<std::uint32_t>(host.size()));
  std::copy(host.begin(), host.end(), out.begin() + 4);
  std::uint8_t* after = out.data() + 4 + host.size();
  put_le<std::uint32_t>(after, 1);
  after[4] = '0';  // CPU 0
  put_le<std::uint64_t>(after + 5, kShmRoomUnknown);
  return out;
}

// A rank of another build is named by the rank that reads its value (a member by its leader, a
// leader by rank 0, rank 0 by the others), rather than its value misread.
TEST(Rendezvous, ARankOfAnotherBuildIsNamed) {
  const auto expect_named = [](const std::function<void()>& exchange, const std::string& who) {
    try {
      exchange();
      FAIL() << "a layout with " << who << " of another build";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("host layout: " + who +
                                           " runs another build of partrain (a layout without a "
                                           "format mark, this build's 2)"),
                std::string::npos)
          << e.what();
    }
  };
  {  // rank 1 of 2, older, set its value: rank 0 names it
    TcpStore store("127.0.0.1", 0, options(true));
    store.set(std::string(kHostLayoutPrefix) + "1", unmarked_site(host_identity()));
    expect_named([&] { exchange_host_layout(store, kHostLayoutPrefix, 0, 2); }, "rank 1");
  }
  {  // rank 2 of 4 leads the second group of two: rank 0 names it by the group's value
    TcpStore store("127.0.0.1", 0, options(true));
    std::vector<std::uint8_t> group = {2, 0, 0, 0};
    for (int r = 0; r < 2; ++r) {
      const auto site = unmarked_site(host_identity());
      group.insert(group.end(), site.begin(), site.end());
    }
    store.set(std::string(kHostLayoutPrefix) + "group/2", group);
    TcpStore rank1("127.0.0.1", store.port(), options(false, milliseconds(300)));
    testing::run_ranks(2, [&](int rank) {
      if (rank == 0) {
        expect_named([&] { exchange_host_layout(store, kHostLayoutPrefix, 0, 4, 2); }, "rank 2");
      } else {
        try {  // rank 1, of this build, publishes its value, then waits for no layout
          exchange_host_layout(rank1, kHostLayoutPrefix, 1, 4, 2);
        } catch (const CommError&) {
        }
      }
    });
  }
  {  // rank 0, older, published its layout: rank 1 names it
    TcpStore store("127.0.0.1", 0, options(true));
    std::vector<std::uint8_t> layout =
        encode_host_layout(group_by_host(std::vector<std::string>{"a", "a"}));
    layout.erase(layout.begin(), layout.begin() + 4);  // the format as it was before the mark
    store.set(std::string(kHostLayoutPrefix) + "layout", layout);
    expect_named([&] { exchange_host_layout(store, kHostLayoutPrefix, 1, 2); }, "rank 0");
  }
  std::vector<std::uint8_t> other =
      encode_host_layout(group_by_host(std::vector<std::string>{"a"}));
  other[3] = '7';  // a later format
  try {
    decode_host_layout(other, 1);
    FAIL() << "a layout of format 7 was read";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 runs another build of partrain (layout format "
                                         "7, this build's 2)"),
              std::string::npos)
        << e.what();
  }
}

// A leader that stops the exchange sets why in place of its value, and every rank waiting on it
// stops with that reason at once: rank 3 of an older build in rank 2's group (fan-in 2) is named
// by rank 2, by rank 0 from rank 2's value, and by rank 1 from rank 0's, well before the store's
// timeout (20 s), at which ranks 0 and 1 stopped before, each with a reason of its own.
TEST(Rendezvous, EveryRankLearnsWhyTheExchangeStopped) {
  TcpStore host("127.0.0.1", 0, options(true, std::chrono::seconds(20)));
  host.set(std::string(kHostLayoutPrefix) + "3", unmarked_site(host_identity()));
  const std::string finding =
      "rank 3 runs another build of partrain (a layout without a format mark, this build's 2): "
      "run the same build on every rank";
  const std::vector<std::string> expected = {"host layout: rank 2 stopped the exchange: " + finding,
                                             "host layout: rank 0 stopped the exchange: " + finding,
                                             "host layout: " + finding};
  const auto start = std::chrono::steady_clock::now();
  testing::run_ranks(3, [&](int rank) {
    TcpStore store("127.0.0.1", host.port(), options(false, std::chrono::seconds(20)));
    try {
      exchange_host_layout(store, kHostLayoutPrefix, rank, 4, 2);
      FAIL() << "rank " << rank << " learned a layout with rank 3 of another build";
    } catch (const CommError& e) {
      EXPECT_EQ(e.what(), expected[static_cast<std::size_t>(rank)]) << rank;
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// A rank that stops before it took part (its data missing, after the ranks met) sets why in
// place of its values, and every rank stops with that finding at once rather than at the
// store's timeout (20 s): a member of rank 0's group, then a leader of a group of its own (the
// default fan-in, 64, leads a second group at rank 64). A rank that took part leaves the
// exchange as it was: its value is there, and repeating the exchange still learns the layout.
TEST(Rendezvous, ARankThatStoppedBeforeTheExchangeSaysWhy) {
  for (const auto& shape : {std::pair{4, 2}, std::pair{66, 64}, std::pair{3, 0}}) {
    // Named copies: a lambda may not capture a structured binding before C++20's clang 16.
    const int world = shape.first;
    const int stopped = shape.second;
    const std::string why =
        "rank " + std::to_string(stopped) + " (h) stopped: /data/train: no such folder";
    SCOPED_TRACE(world);
    TcpStore host("127.0.0.1", 0, options(true, std::chrono::seconds(20)));
    const auto start = std::chrono::steady_clock::now();
    testing::run_ranks(world, [&](int rank) {
      TcpStore store("127.0.0.1", host.port(), options(false, std::chrono::seconds(20)));
      if (rank == stopped) {
        stop_host_layout(store, kHostLayoutPrefix, rank, world, why);
        return;
      }
      try {
        exchange_host_layout(store, kHostLayoutPrefix, rank, world);
        FAIL() << "rank " << rank << " learned a layout without rank " << stopped;
      } catch (const CommError& e) {
        // Rank 0 read the stopped rank's own value (or its group's, which names it as it is);
        // the others, rank 0's, which names rank 0, unless rank 0 was the one that stopped.
        const std::string by = rank == 0 || stopped == 0 ? "" : "rank 0 stopped the exchange: ";
        EXPECT_EQ(e.what(), "host layout: " + by + why) << rank;
      }
    });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
  TcpStore host("127.0.0.1", 0, options(true));
  testing::run_ranks(2, [&](int rank) {
    TcpStore store("127.0.0.1", host.port(), options(false));
    exchange_host_layout(store, kHostLayoutPrefix, rank, 2);
  });
  TcpStore store("127.0.0.1", host.port(), options(false));
  stop_host_layout(store, kHostLayoutPrefix, 1, 2,
                   "rank 1 (h) stopped: /data/train: no such folder");
  EXPECT_EQ(exchange_host_layout(store, kHostLayoutPrefix, 1, 2).ranks(), 2);
}

TEST(Rendezvous, ABarrierNamesTheRanksThatDidNotArrive) {
  constexpr int kWorld = 4;
  TcpStore host("127.0.0.1", 0, options(true));
  testing::run_ranks(2, [&](int rank) {
    TcpStore store("127.0.0.1", host.port(), options(false));
    try {
      store_barrier(store, "b", rank, kWorld, milliseconds(200));
      FAIL() << "the barrier let rank " << rank << " through with two ranks missing";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank(s) 2, 3 did not arrive within 200 ms"),
                std::string::npos)
          << e.what();
    }
  });
}

// A rank that learns the missing ranks will not come stops waiting (stop_waiting) and releases
// the ranks that came; one that comes later passes at once. Without that news the sliced wait
// keeps its bound and names who is missing.
TEST(Rendezvous, ABarrierThatStopsWaitingReleasesTheRanksThatCame) {
  TcpStore host("127.0.0.1", 0, options(true));
  testing::run_ranks(2, [&](int rank) {
    TcpStore store("127.0.0.1", host.port(), options(false));
    if (rank == 1) {
      EXPECT_TRUE(store_barrier(store, "b", 1, 3, milliseconds(20000)));
      return;
    }
    EXPECT_FALSE(store_barrier(store, "b", 0, 3, milliseconds(20000),
                               [&] { return store_barrier_arrivals(store, "b") == 2; }));
    store_barrier_release(store, "b");
  });
  TcpStore late("127.0.0.1", host.port(), options(false));
  EXPECT_TRUE(store_barrier(late, "b", 2, 3, milliseconds(100)));
  const auto start = std::chrono::steady_clock::now();
  try {
    store_barrier(late, "c", 0, 2, milliseconds(250), [] { return false; });
    ADD_FAILURE() << "the barrier let rank 0 through without rank 1";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 did not arrive within 250 ms"),
              std::string::npos)
        << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(250));
}

TEST(Rendezvous, ThePublishedLayoutReadsBackAndABadOneIsRefused) {
  const HostLayout layout = group_by_host({"a", "a", "b", "a", "c", "c"});
  const std::vector<std::uint8_t> bytes = encode_host_layout(layout);
  const HostLayout back = decode_host_layout(bytes, 6);
  EXPECT_EQ(back, layout);
  EXPECT_EQ(back.members(0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(back.members(1), (std::vector<int>{2}));
  EXPECT_EQ(back.members(2), (std::vector<int>{4, 5}));
  EXPECT_EQ(back.host_of_each(), (std::vector<int>{0, 0, 1, 0, 2, 2}));
  for (int r = 0; r < 6; ++r) EXPECT_EQ(back.host_of(r), back.host_of_each()[r]) << r;
  EXPECT_EQ(back.runs.size(), 4u);  // {0, 1} on a, 2 on b, 3 on a, {4, 5} on c
  EXPECT_EQ(back.largest_host(), 3u);
  EXPECT_THROW(back.host_of(6), UsageError);
  EXPECT_THROW(decode_host_layout(bytes, 7), CommError);  // another world's layout
  std::vector<std::uint8_t> cut(bytes.begin(), bytes.end() - 3);
  EXPECT_THROW(decode_host_layout(cut, 6), CommError);
  // A value listing its hosts out of rank order decodes to the layout group_by_host() makes
  // (host 0 holds rank 0); one naming a host twice is refused.
  HostLayout reordered = layout;
  std::swap(reordered.identities[0], reordered.identities[2]);
  std::swap(reordered.host_sizes[0], reordered.host_sizes[2]);
  for (auto& run : reordered.runs) run.host = run.host == 0 ? 2 : run.host == 2 ? 0 : run.host;
  const HostLayout renumbered = decode_host_layout(encode_host_layout(reordered), 6);
  EXPECT_EQ(renumbered, layout);
  HostLayout twice = layout;
  twice.identities[2] = "a";
  EXPECT_THROW(decode_host_layout(encode_host_layout(twice), 6), CommError);
  // One host: one run, whatever the world, in the value and in what a rank holds.
  const HostLayout large = group_by_host(std::vector<std::string>(10000, "h"));
  EXPECT_EQ(encode_host_layout(large).size(),
            encode_host_layout(group_by_host(std::vector<std::string>(2, "h"))).size());
  const HostLayout decoded = decode_host_layout(encode_host_layout(large), 10000);
  EXPECT_EQ(decoded.runs.size(), 1u);
  EXPECT_EQ(decoded.host_of(9999), 0);
}

// A host's CPUs are the union of its ranks' affinities: four ranks bound one core each do not
// share, four that may each run on both of two cores do; the count travels in the value.
TEST(Rendezvous, AHostsCpusAreTheUnionOfItsRanksAffinities) {
  EXPECT_EQ(distinct_cpus({"0-3,8"}), 5);
  EXPECT_EQ(distinct_cpus({"0-1", "1-2", "7"}), 4);
  EXPECT_EQ(distinct_cpus({"0"}), 1);
  for (const char* bad : {"", "x", "3-1", "1-", "-1", "0,,1", "0;1", "70000", "1234567"}) {
    EXPECT_EQ(distinct_cpus({"0-1", bad}), 0) << bad;  // not known
  }
  const std::vector<RankSite> bound = {{"a", "0"}, {"a", "1"}, {"a", "2"}, {"a", "3"}};
  const HostLayout apart = group_by_host(bound);
  EXPECT_EQ(apart.host_cpus, (std::vector<int>{4}));
  EXPECT_FALSE(apart.shares_cores());
  const std::vector<RankSite> crowded = {{"a", "0-1"}, {"b", "0-7"}, {"a", "0-1"}, {"a", "0,1"}};
  const HostLayout turns = group_by_host(crowded);
  EXPECT_EQ(turns.host_cpus, (std::vector<int>{2, 8}));
  EXPECT_TRUE(turns.shares_cores());  // three ranks on a's two CPUs
  EXPECT_EQ(decode_host_layout(encode_host_layout(turns), 4), turns);
  // Not known (identities alone, or a rank that could not say): never taken for sharing.
  EXPECT_FALSE(group_by_host({"a", "a", "a"}).shares_cores());
  EXPECT_FALSE(group_by_host(std::vector<RankSite>{{"a", "0"}, {"a", ""}}).shares_cores());
#if defined(__linux__)
  EXPECT_GT(distinct_cpus({cpu_affinity()}), 0) << cpu_affinity();
#endif
}

// A host's room for shared memory is the least any of its ranks saw (a rank that could not say
// leaves it to the others; a full /dev/shm is no room), and travels in the value.
TEST(Rendezvous, AHostsShmRoomIsTheLeastItsRanksSaw) {
  const std::uint64_t unknown = kShmRoomUnknown;
  const std::vector<RankSite> sites = {{"a", "0", 64 << 20}, {"b", "1", 0},
                                       {"a", "1", unknown},  {"a", "2", 48 << 20},
                                       {"c", "0", unknown},  {"b", "2", 8 << 20}};
  const HostLayout layout = group_by_host(sites);
  EXPECT_EQ(layout.host_shm_room, (std::vector<std::uint64_t>{48 << 20, 0, unknown}));
  EXPECT_EQ(decode_host_layout(encode_host_layout(layout), 6), layout);
  const std::uint64_t large = std::uint64_t{5} << 40;  // more than 32 bits' worth
  const HostLayout big = group_by_host(std::vector<RankSite>{{"a", "0", large}, {"a", "1", large}});
  EXPECT_EQ(decode_host_layout(encode_host_layout(big), 2).host_shm_room[0], large);
  EXPECT_EQ(group_by_host(std::vector<std::string>{"a", "b"}).host_shm_room,
            (std::vector<std::uint64_t>{unknown, unknown}));
#if defined(__linux__)
  if (std::filesystem::exists("/dev/shm")) {
    EXPECT_LE(shm_room(), std::filesystem::space("/dev/shm").capacity);
  }
#endif
}

TEST(Rendezvous, CpuListsReadAndWriteBack) {
  EXPECT_EQ(cpus_of("0-3,8"), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(cpus_of("8,0-1,1"), (std::vector<int>{0, 1, 8}));
  EXPECT_TRUE(cpus_of("3-1").empty());
  EXPECT_EQ(cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(cpu_list({5}), "5");
  EXPECT_EQ(cpu_list({}), "");
  for (const char* list : {"0", "0-63", "1,3,5-9,12"}) EXPECT_EQ(cpu_list(cpus_of(list)), list);
}

// Cores are grouped by the hardware threads that share them, and each rank gets whole cores in
// the order of their lowest CPU: with Linux numbering the second threads after all the first
// ones, the ranks' CPUs are not neighbouring numbers.
TEST(Rendezvous, RanksAreBoundToWholeCoresInOrder) {
  // 4 cores x 2 threads: CPU c and c + 4 share core c.
  const auto siblings = [](int cpu) { return cpu_list({cpu % 4, cpu % 4 + 4}); };
  const std::vector<std::vector<int>> cores = group_into_cores({7, 0, 1, 2, 3, 4, 5, 6}, siblings);
  EXPECT_EQ(cores, (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(bind_ranks(cores, 2), (std::vector<std::vector<int>>{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(bind_ranks(cores, 4), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Three ranks on four cores: every core is someone's, none is split.
  EXPECT_EQ(bind_ranks(cores, 3), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 3, 6, 7}}));
  // More ranks than cores, as many as hardware threads: a thread each, core by core.
  EXPECT_EQ(bind_ranks(cores, 8),
            (std::vector<std::vector<int>>{{0}, {4}, {1}, {5}, {2}, {6}, {3}, {7}}));
  EXPECT_EQ(bind_ranks(cores, 5),
            (std::vector<std::vector<int>>{{0}, {1, 4}, {5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(bind_ranks({{0, 1}}, 2), (std::vector<std::vector<int>>{{0}, {1}}));
  // More ranks than hardware threads share them, as evenly as they divide; one rank needs no
  // binding.
  EXPECT_EQ(bind_ranks(cores, 9),
            (std::vector<std::vector<int>>{{0}, {0}, {4}, {1}, {5}, {2}, {6}, {3}, {7}}));
  EXPECT_EQ(bind_ranks({{0}, {1}}, 4), (std::vector<std::vector<int>>{{0}, {0}, {1}, {1}}));
  EXPECT_EQ(bind_ranks({{0}, {1}}, 3), (std::vector<std::vector<int>>{{0}, {0}, {1}}));
  EXPECT_TRUE(bind_ranks(cores, 1).empty());
  EXPECT_TRUE(bind_ranks({}, 2).empty());
  // A CPU whose core the system does not name is a core of its own.
  const auto unnamed = group_into_cores({0, 1, 2}, [](int) { return std::string(); });
  EXPECT_EQ(unnamed, (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  EXPECT_EQ(bind_ranks(unnamed, 2), (std::vector<std::vector<int>>{{0}, {1, 2}}));
#if defined(__linux__)
  // This machine's own: every allowed CPU in exactly one core (none outside Linux).
  std::vector<int> all;
  for (const auto& core : allowed_cores()) all.insert(all.end(), core.begin(), core.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, cpus_of(cpu_affinity()));
#endif
}

}  // namespace
}  // namespace partrain::comm
