// The hierarchical backend on test hosts made of network namespaces (tests/multinode/netns.h):
// each rank is a thread that enters its host's namespace, so host_identity() tells the hosts
// apart exactly as it tells machines apart, and the leaders' ring runs over the hosts' 10.x
// addresses. Checked: every layout (even, uneven, interleaved ranks, three hosts) gives every
// rank the same bits, close to the exact reduction; broadcast, allgather and barrier; auto's
// choice; with one rank per host the flat ring's bits. Killed and frozen ranks, as processes:
// every survivor on every host names the victim in time.
#include <gtest/gtest.h>

#ifdef __linux__

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/comm/rank_process.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"
#include "tests/comm/reference_values.h"
#include "tests/multinode/netns.h"

namespace partrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
using partrain_test::NetnsHosts;
using std::chrono::milliseconds;

// Moves the calling thread into host `host`'s network namespace.
void enter_host(const NetnsHosts& hosts, int host) {
  const std::string path = "/var/run/netns/" + hosts.name(host);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << "cannot open " << path;
  const int entered = ::setns(fd, CLONE_NEWNET);
  ::close(fd);
  ASSERT_EQ(entered, 0) << "setns into " << path << ": " << std::strerror(errno);
}

// host_of[r]: the host rank r runs on.
struct Layout {
  std::vector<int> host_of;
  int hosts() const { return *std::max_element(host_of.begin(), host_of.end()) + 1; }
  int world() const { return static_cast<int>(host_of.size()); }
};

std::string layout_name(const Layout& layout) {
  std::string name = "hosts";
  for (int h : layout.host_of) {
    name += '_';  // appended apart: GCC 12 warns falsely (-Wrestrict) on "_" + to_string(h)
    name += std::to_string(h);
  }
  return name;
}

// Runs body(rank, comm) for every rank of `layout`, each on a thread inside its host.
template <typename Body>
void run_on_hosts(const NetnsHosts& hosts, const Layout& layout, CommOptions options, Body&& body) {
  testing::ScratchDir dir;
  testing::run_ranks(layout.world(), [&](int rank) {
    enter_host(hosts, layout.host_of[rank]);
    StoreOptions store_options;
    store_options.rank = rank;
    store_options.world_size = layout.world();
    store_options.timeout = milliseconds(20000);
    auto store = open_store(dir.url(), store_options);
    CommOptions mine = options;
    mine.bind_host = hosts.address(layout.host_of[rank]);
    auto comm = make_communicator(mine, *store, rank, layout.world());
    body(rank, *comm);
  });
}

CommOptions hierarchical_options(DType wire = DType::f32) {
  CommOptions options;
  options.backend = "hierarchical";
  options.timeout = milliseconds(20000);
  options.wire_dtype = wire;
  options.token = "hierarchical-test";
  return options;
}

// Values over many binades, so that reductions in different orders round differently and
// the checks below see that every rank got the same bits, not merely close ones.
double input_value(int rank, std::size_t i, DType dtype) {
  const double small = static_cast<double>(static_cast<int>((rank * 7 + i * 13) % 17) - 8);
  if (dtype == DType::i32 || dtype == DType::i64) return small * 1000 + rank;
  return std::ldexp(small + 0.375 * rank, static_cast<int>(i % 11) - 5);
}

double expected_value(int world, std::size_t i, ReduceOp op, DType dtype) {
  std::vector<double> values;
  for (int r = 0; r < world; ++r) {
    // The inputs as the dtype holds them.
    alignas(8) std::uint8_t bytes[8];
    store_value(bytes, dtype, 0, input_value(r, i, dtype));
    values.push_back(load_value(bytes, dtype, 0));
  }
  return reduce_reference(values, op, dtype);
}

double tolerance(DType dtype, DType wire) {
  if (dtype == DType::i32 || dtype == DType::i64) return 0;
  if (dtype == DType::f16 || dtype == DType::bf16 || wire != DType::f32) return 0.05;
  if (dtype == DType::f32) return 1e-5;
  return 1e-12;
}

struct Case {
  DType dtype;
  ReduceOp op;
  DType wire;
  std::size_t count;
};

std::vector<Case> cases() {
  std::vector<Case> list;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
      list.push_back({dtype, op, DType::f32, 1001});
    }
  }
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
    list.push_back({DType::f32, ReduceOp::sum, DType::f32, count});
  }
  list.push_back({DType::f32, ReduceOp::sum, DType::bf16, 4099});
  list.push_back({DType::f32, ReduceOp::avg, DType::f16, 4099});
  // Several pieces of the shared-memory slots (256 KiB each) and several ring chunks.
  list.push_back({DType::f32, ReduceOp::sum, DType::f32, 700001});
  return list;
}

class Hierarchical : public ::testing::TestWithParam<Layout> {};

TEST_P(Hierarchical, AllreduceGivesEveryRankTheSameBitsCloseToTheExactReduction) {
  const Layout layout = GetParam();
  NetnsHosts hosts(layout.hosts());
  if (!hosts.ok()) GTEST_SKIP() << hosts.why_not();
  const auto list = cases();
  const int world = layout.world();
  // results[case][rank]
  std::vector<std::vector<std::vector<std::uint8_t>>> results(
      list.size(), std::vector<std::vector<std::uint8_t>>(world));
  std::atomic<int> wrong{0};
  // One communicator per wire format, as a run has one.
  for (DType wire : {DType::f32, DType::bf16, DType::f16}) {
    run_on_hosts(hosts, layout, hierarchical_options(wire), [&](int rank, Communicator& comm) {
      EXPECT_EQ(comm.name(), "hierarchical");
      EXPECT_EQ(comm.rank(), rank);
      EXPECT_EQ(comm.size(), world);
      for (std::size_t c = 0; c < list.size(); ++c) {
        const Case& k = list[c];
        if (k.wire != wire) continue;
        std::vector<std::uint8_t> data(k.count * dtype_size(k.dtype));
        for (std::size_t i = 0; i < k.count; ++i) {
          store_value(data.data(), k.dtype, i, input_value(rank, i, k.dtype));
        }
        comm.allreduce(Buffer{data.data(), k.count, k.dtype}, k.op);
        int bad = 0;
        for (std::size_t i = 0; i < k.count; ++i) {
          const double want = expected_value(world, i, k.op, k.dtype);
          const double got = load_value(data.data(), k.dtype, i);
          if (std::abs(got - want) > tolerance(k.dtype, k.wire) * std::max(1.0, std::abs(want))) {
            if (++bad <= 3) {
              ADD_FAILURE() << "rank " << rank << " " << dtype_name(k.dtype) << " "
                            << reduce_op_name(k.op) << " wire " << dtype_name(k.wire) << " count "
                            << k.count << " [" << i << "]: got " << got << ", want " << want;
            }
          }
        }
        wrong += bad;
        results[c][rank] = std::move(data);
      }
    });
  }
  EXPECT_EQ(wrong.load(), 0);
  for (std::size_t c = 0; c < list.size(); ++c) {
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(results[c][r], results[c][0])
          << "ranks 0 and " << r << " differ in " << dtype_name(list[c].dtype) << " "
          << reduce_op_name(list[c].op) << " wire " << dtype_name(list[c].wire) << " count "
          << list[c].count;
    }
  }
}

TEST_P(Hierarchical, BroadcastAllgatherBarrier) {
  const Layout layout = GetParam();
  NetnsHosts hosts(layout.hosts());
  if (!hosts.ok()) GTEST_SKIP() << hosts.why_not();
  const int world = layout.world();
  std::atomic<int> arrived{0};
  run_on_hosts(hosts, layout, hierarchical_options(), [&](int rank, Communicator& comm) {
    for (int root = 0; root < world; ++root) {
      for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{600001}}) {
        std::vector<float> data(count, -1.0f);
        if (rank == root) {
          for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(root * 1000003 + i);
        }
        comm.broadcast(Buffer{data.data(), count, DType::f32}, root);
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(data[i], static_cast<float>(root * 1000003 + i))
              << "rank " << rank << " root " << root << " [" << i << "]";
        }
      }
    }
    for (std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{777}, std::size_t{300001}}) {
      std::vector<std::int64_t> in(count), out(count * world, -1);
      for (std::size_t i = 0; i < count; ++i)
        in[i] = rank * 10000000 + static_cast<std::int64_t>(i);
      comm.allgather(Buffer{in.data(), count, DType::i64},
                     Buffer{out.data(), out.size(), DType::i64});
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r * count + i], r * 10000000 + static_cast<std::int64_t>(i))
              << "rank " << rank << " block " << r << " [" << i << "]";
        }
      }
    }
    for (int round = 1; round <= 3; ++round) {
      arrived.fetch_add(1);
      comm.barrier();
      // Nobody leaves a barrier before everyone has reached it.
      EXPECT_GE(arrived.load(), round * world);
      comm.barrier();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, Hierarchical,
                         ::testing::Values(Layout{{0, 0, 1, 1}},  // 2 hosts x 2 ranks
                                           Layout{{0, 0, 1}},     // uneven: 2 + 1
                                           Layout{{0, 1, 1}},     // uneven, rank 0 alone
                                           Layout{{0, 1, 0, 1}},  // ranks interleaved across hosts
                                           Layout{{0, 0, 1, 1, 2}}),  // three hosts
                         [](const auto& info) { return layout_name(info.param); });

// auto: one rank per host keeps the flat ring; several on some host take hierarchical.
TEST(HierarchicalAuto, PicksHierarchicalAcrossHostsWithSeveralRanksOnAHost) {
  for (const Layout& layout : {Layout{{0, 0, 1, 1}}, Layout{{0, 0, 1}}, Layout{{0, 1}}}) {
    NetnsHosts hosts(layout.hosts());
    if (!hosts.ok()) GTEST_SKIP() << hosts.why_not();
    CommOptions options = hierarchical_options();
    options.backend = "auto";
    std::vector<std::string> names(layout.world());
    run_on_hosts(hosts, layout, options, [&](int rank, Communicator& comm) {
      names[rank] = comm.name();
      std::vector<float> x(10, 1.0f);
      comm.allreduce(Buffer{x.data(), x.size(), DType::f32}, ReduceOp::sum);
      EXPECT_EQ(x[9], static_cast<float>(layout.world()));
    });
    const std::string want = layout.world() == layout.hosts() ? "asio-ring" : "hierarchical";
    for (const auto& name : names) EXPECT_EQ(name, want) << layout_name(layout);
  }
}

// One rank per host: the hierarchical backend is the leaders' ring alone, the flat ring's bits.
TEST(HierarchicalOneRankPerHost, SameBitsAsTheFlatRing) {
  const Layout layout{{0, 1, 2}};
  NetnsHosts hosts(layout.hosts());
  if (!hosts.ok()) GTEST_SKIP() << hosts.why_not();
  std::map<std::string, std::vector<std::vector<float>>> results;
  for (const std::string backend : {"hierarchical", "asio-ring"}) {
    CommOptions options = hierarchical_options(DType::bf16);
    options.backend = backend;
    results[backend].resize(layout.world());
    run_on_hosts(hosts, layout, options, [&](int rank, Communicator& comm) {
      std::vector<float> data(5003);
      for (std::size_t i = 0; i < data.size(); ++i) {
        data[i] = static_cast<float>(input_value(rank, i, DType::f32));
      }
      comm.allreduce(Buffer{data.data(), data.size(), DType::f32}, ReduceOp::avg);
      results[backend][rank] = std::move(data);
    });
  }
  EXPECT_EQ(results["hierarchical"], results["asio-ring"]);
}

// ---- failures, with ranks as processes ------------------------------------------------------

// Starts the ranks of `layout` (comm_rank_process, backend hierarchical) in their hosts,
// waits until all run, injures `victim` with `signal_number`, and checks that every other
// rank exits with a PeerError naming the victim within twice the timeout (plus a second for
// the start of a process and the trace through the store).
void expect_victim_named(const Layout& layout, int victim, int signal_number) {
  constexpr int kTimeoutMs = 1500;
  NetnsHosts hosts(layout.hosts());
  if (!hosts.ok()) GTEST_SKIP() << hosts.why_not();
  testing::ScratchDir dir;
  const std::string store = "file://" + (dir.path() / "store").string();
  std::vector<RankProcess> ranks(layout.world());
  for (int r = 0; r < layout.world(); ++r) {
    ranks[r].log = dir.path() / ("rank-" + std::to_string(r) + ".log");
    ranks[r].ready = dir.path() / ("ready-" + std::to_string(r));
    ranks[r].pid =
        hosts.spawn(layout.host_of[r],
                    {COMM_RANK_PROCESS, store, std::to_string(r), std::to_string(layout.world()),
                     "hierarchical", std::to_string(kTimeoutMs), ranks[r].ready.string(),
                     hosts.address(layout.host_of[r])},
                    ranks[r].log);
  }
  expect_survivors_name(ranks, victim, signal_number, milliseconds(2 * kTimeoutMs + 1000));
}

// Rank 3 shares host 1 with rank 2, its leader: host 0 learns of it only through the ring.
TEST(HierarchicalFailure, KilledRankBehindALeaderIsNamedOnEveryHost) {
  expect_victim_named(Layout{{0, 0, 1, 1}}, 3, SIGKILL);
}

TEST(HierarchicalFailure, KilledLeaderIsNamedOnEveryHost) {
  expect_victim_named(Layout{{0, 0, 1, 1}}, 2, SIGKILL);
}

// Frozen (SIGSTOP): no exit, no closed socket; only the timeouts tell.
TEST(HierarchicalFailure, FrozenRankBehindALeaderIsNamedOnEveryHost) {
  expect_victim_named(Layout{{0, 0, 1, 1}}, 1, SIGSTOP);
}

TEST(HierarchicalFailure, FrozenLeaderIsNamedOnEveryHost) {
  expect_victim_named(Layout{{0, 0, 1, 1}}, 2, SIGSTOP);
}

TEST(HierarchicalFailure, KilledRankOnTheFullerOfTwoUnevenHostsIsNamed) {
  expect_victim_named(Layout{{0, 0, 1}}, 1, SIGKILL);
}

}  // namespace
}  // namespace partrain::comm

#endif
