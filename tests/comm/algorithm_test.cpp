// Every algorithm of the peer transport (comm.algorithm forcing each family) x world sizes,
// powers of two and not (3, 5, 6, 7 fold as MPICH does) x element counts x dtypes x wires:
// each rank's result against the exact reduction, and every rank's bits against rank 0's.
// reduce_scatter, allgather and broadcast alike; and what auto picks by size and world.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "comm_backends/algorithms/algorithm_choice.h"
#include "comm_backends/communicator.h"
#include "comm_backends/placement.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/comm/reference_values.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

struct AlgorithmSetup {
  std::string algorithm;
  int world;
};

std::string setup_name(const ::testing::TestParamInfo<AlgorithmSetup>& info) {
  return info.param.algorithm + "_w" + std::to_string(info.param.world);
}

// Small integers with a sign: sums stay exact even in bf16.
double input_value(int rank, std::size_t i) {
  return static_cast<double>(static_cast<int>((rank * 7 + i * 13) % 17) - 8);
}

double tolerance(DType dtype, DType wire) {
  if (dtype == DType::bf16 || wire == DType::bf16) return 0.04;
  if (dtype == DType::f16 || wire == DType::f16) return 0.005;
  return 1e-6;
}

struct Case {
  DType dtype;
  ReduceOp op;
  std::size_t count;
};

// Counts around the block boundaries of every algorithm: none, one, fewer than the ranks, and
// uneven blocks; a larger one runs several ring chunks and exchange pieces (chunk 1001 bytes,
// cut down to whole elements for the pieces).
std::vector<Case> cases(int world) {
  std::vector<Case> list;
  const std::vector<std::size_t> counts = {0, 1, static_cast<std::size_t>(world - 1), 1001, 9001};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
    for (std::size_t count : counts) list.push_back({DType::f32, op, count});
  }
  for (DType dtype : {DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) list.push_back({dtype, op, 1001});
  }
  return list;
}

class Algorithms : public ::testing::TestWithParam<AlgorithmSetup> {
 protected:
  // Runs body(rank, comm) on every rank, one communicator per wire type.
  template <typename Body>
  void on_ranks(DType wire, Body&& body) {
    const AlgorithmSetup setup = GetParam();
    testing::ScratchDir dir;
    testing::run_ranks(setup.world, [&](int rank) {
      StoreOptions store_options;
      store_options.timeout = milliseconds(20000);
      auto store = open_store(dir.url(), store_options);
      CommOptions options;
      options.backend = "asio-ring";
      options.algorithm = setup.algorithm;
      options.timeout = milliseconds(30000);
      options.wire_dtype = wire;
      options.ring_chunk_bytes = 1001;
      // A host per rank: no rank shares a core, so the exchanges go in pieces of the chunk
      // (Note [Pipelined exchange]), several per message at the larger counts.
      std::vector<std::string> hosts;
      for (int r = 0; r < setup.world; ++r) hosts.push_back("host" + std::to_string(r));
      auto comm = make_communicator(options, *store, RankHosts(group_by_host(hosts)), rank);
      body(rank, *comm);
    });
  }
};

TEST_P(Algorithms, AllreduceAndReduceScatterGiveTheExactResultAndTheSameBits) {
  const int world = GetParam().world;
  const auto list = cases(world);
  for (DType wire : {DType::f32, DType::bf16}) {
    // allreduce[case][rank], reduce_scatter[case][rank]: the bytes each rank ended with.
    std::vector<std::vector<std::vector<std::uint8_t>>> all(
        list.size(), std::vector<std::vector<std::uint8_t>>(world));
    std::atomic<int> wrong{0};
    on_ranks(wire, [&](int rank, Communicator& comm) {
      for (std::size_t c = 0; c < list.size(); ++c) {
        const Case& k = list[c];
        const std::size_t elem = dtype_size(k.dtype);
        std::vector<std::uint8_t> data(k.count * elem), scattered(k.count * elem);
        std::vector<std::uint8_t> in(k.count * world * elem);
        for (std::size_t i = 0; i < k.count; ++i)
          store_value(data.data(), k.dtype, i, input_value(rank, i));
        for (std::size_t i = 0; i < k.count * world; ++i) {
          store_value(in.data(), k.dtype, i, input_value(rank, i));
        }
        const std::vector<std::uint8_t> in_before = in;
        comm.allreduce(Buffer{data.data(), k.count, k.dtype}, k.op);
        comm.reduce_scatter(Buffer{in.data(), k.count * world, k.dtype},
                            Buffer{scattered.data(), k.count, k.dtype}, k.op);
        EXPECT_EQ(in, in_before) << "reduce_scatter changed its input";
        const auto want = [&](std::size_t i) {
          std::vector<double> values;
          for (int r = 0; r < world; ++r) values.push_back(input_value(r, i));
          return reduce_reference(values, k.op, k.dtype);
        };
        const double tol = tolerance(k.dtype, wire);
        for (std::size_t i = 0; i < k.count; ++i) {
          const double a = load_value(data.data(), k.dtype, i), w = want(i);
          const double s = load_value(scattered.data(), k.dtype, i);
          const double ws = want(rank * k.count + i);
          if (std::abs(a - w) > tol * std::max(1.0, std::abs(w)) ||
              std::abs(s - ws) > tol * std::max(1.0, std::abs(ws))) {
            if (++wrong <= 3) {
              ADD_FAILURE() << "rank " << rank << " " << dtype_name(k.dtype) << " "
                            << reduce_op_name(k.op) << " count " << k.count << " wire "
                            << dtype_name(wire) << " [" << i << "]: allreduce " << a << " (want "
                            << w << "), reduce_scatter " << s << " (want " << ws << ")";
            }
          }
        }
        all[c][rank] = std::move(data);
      }
    });
    EXPECT_EQ(wrong.load(), 0);
    for (std::size_t c = 0; c < list.size(); ++c) {
      for (int r = 1; r < world; ++r) {
        EXPECT_EQ(all[c][r], all[c][0])
            << "ranks 0 and " << r << " differ: " << dtype_name(list[c].dtype) << " "
            << reduce_op_name(list[c].op) << " count " << list[c].count << " wire "
            << dtype_name(wire);
      }
    }
  }
}

TEST_P(Algorithms, AllgatherBroadcastAndBarrier) {
  const int world = GetParam().world;
  on_ranks(DType::f32, [&](int rank, Communicator& comm) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3001}}) {
      std::vector<std::int32_t> in(count), out(count * world, -1);
      for (std::size_t i = 0; i < count; ++i) in[i] = rank * 100000 + static_cast<int>(i);
      comm.allgather(Buffer{in.data(), count, DType::i32},
                     Buffer{out.data(), out.size(), DType::i32});
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r * count + i], r * 100000 + static_cast<int>(i)) << "rank " << rank;
        }
      }
      for (int root = 0; root < world; ++root) {
        std::vector<std::int32_t> data(count, rank == root ? 7 + root : -1);
        comm.broadcast(Buffer{data.data(), count, DType::i32}, root);
        for (std::int32_t v : data) ASSERT_EQ(v, 7 + root) << "rank " << rank << " root " << root;
      }
    }
    comm.barrier();
  });
}

std::vector<AlgorithmSetup> setups() {
  std::vector<AlgorithmSetup> list;
  for (const char* algorithm : {"ring", "recursive_doubling", "rabenseifner"}) {
    for (int world : {2, 3, 4, 5, 6, 7, 8}) list.push_back({algorithm, world});
  }
  return list;
}

INSTANTIATE_TEST_SUITE_P(Forced, Algorithms, ::testing::ValuesIn(setups()), setup_name);

// auto takes recursive doubling for small messages, the ring for large ones, Rabenseifner in
// between where the world is large enough for it to pay; the forced families map to each
// collective's algorithm of that family.
TEST(AlgorithmChoice, BySizeAndWorldOrAsForced) {
  const CostModel model = loopback_model();
  const auto pick = [&](CollectiveKind kind, std::size_t bytes, int world,
                        AlgorithmRequest request = AlgorithmRequest::automatic) {
    return choose_algorithm(kind, bytes, world, request, model, 256 << 10);
  };
  using K = CollectiveKind;
  for (int world : {2, 4, 8, 16, 64, 1024}) {
    EXPECT_EQ(pick(K::allreduce, 4 << 10, world), Algorithm::recursive_doubling) << world;
    EXPECT_EQ(pick(K::allreduce, 1 << 30, world), Algorithm::ring) << world;
    EXPECT_EQ(pick(K::broadcast, 4 << 10, world), Algorithm::binomial_tree) << world;
  }
  // At 1024 ranks the ring's 2046 messages lose to Rabenseifner's 20 well past 1 MiB.
  EXPECT_EQ(pick(K::allreduce, 4 << 20, 1024), Algorithm::rabenseifner);
  EXPECT_EQ(pick(K::barrier, 4, 7), Algorithm::recursive_doubling);
  EXPECT_EQ(pick(K::reduce_scatter, 1 << 30, 8, AlgorithmRequest::recursive_doubling),
            Algorithm::recursive_halving);
  EXPECT_EQ(pick(K::allreduce, 4, 8, AlgorithmRequest::rabenseifner), Algorithm::rabenseifner);
  EXPECT_EQ(pick(K::allgather, 4, 8, AlgorithmRequest::rabenseifner),
            Algorithm::recursive_doubling);
  EXPECT_EQ(pick(K::broadcast, 4, 8, AlgorithmRequest::ring), Algorithm::ring);
  EXPECT_EQ(parse_algorithm_request("auto"), AlgorithmRequest::automatic);
  EXPECT_THROW(parse_algorithm_request("bcube"), UsageError);
}

// What each allreduce sends out of the busiest host, in buffers, walked over the layout.
TEST(AlgorithmChoice, HostTrafficCountsWhatLeavesTheBusiestHost) {
  const HostTraffic two_by_two = host_traffic({0, 0, 1, 1});
  EXPECT_TRUE(two_by_two.between_hosts);
  EXPECT_DOUBLE_EQ(two_by_two.ring, 1.5);                // one boundary each way, 2(W-1)/W
  EXPECT_DOUBLE_EQ(two_by_two.recursive_doubling, 2.0);  // both ranks, the whole buffer
  EXPECT_DOUBLE_EQ(two_by_two.rabenseifner, 1.0);        // nearest partner first: quarters across
  const HostTraffic two_by_four = host_traffic({0, 0, 0, 0, 1, 1, 1, 1});
  EXPECT_DOUBLE_EQ(two_by_four.ring, 1.75);
  EXPECT_DOUBLE_EQ(two_by_four.recursive_doubling, 4.0);
  EXPECT_DOUBLE_EQ(two_by_four.rabenseifner, 1.0);  // 2(H-1)/H
  // Six ranks fold, and the fold's pair 2/3 straddles the hosts (the whole buffer across,
  // both ways), as does the first halving step's pair of new ranks 0 and 1 (ranks 1 and 3):
  // here the ring moves less between hosts, and the choice stays with it.
  const HostTraffic folded = host_traffic({0, 0, 0, 1, 1, 1});
  EXPECT_DOUBLE_EQ(folded.ring, 10.0 / 6);
  EXPECT_DOUBLE_EQ(folded.rabenseifner, 2.5);
  EXPECT_EQ(choose_algorithm(CollectiveKind::allreduce, 64 << 20, 6, AlgorithmRequest::automatic,
                             loopback_model(), 256 << 10, &folded),
            Algorithm::ring);
  // One rank per host: every byte a rank sends leaves its host.
  const HostTraffic one_each = host_traffic({0, 1, 2, 3});
  EXPECT_DOUBLE_EQ(one_each.ring, 1.5);
  EXPECT_DOUBLE_EQ(one_each.recursive_doubling, 2.0);
  EXPECT_DOUBLE_EQ(one_each.rabenseifner, 1.5);
  EXPECT_FALSE(host_traffic({0, 0, 0, 0}).between_hosts);
  // The choice: a large allreduce over two hosts of two ranks goes to Rabenseifner, the same
  // on one host to the ring; a small one stays with recursive doubling either way.
  const CostModel model = loopback_model();
  const auto pick = [&](std::size_t bytes, const HostTraffic* traffic) {
    return choose_algorithm(CollectiveKind::allreduce, bytes, 4, AlgorithmRequest::automatic, model,
                            256 << 10, traffic);
  };
  EXPECT_EQ(pick(64 << 20, nullptr), Algorithm::ring);
  EXPECT_EQ(pick(64 << 20, &two_by_two), Algorithm::rabenseifner);
  EXPECT_EQ(pick(1 << 20, &two_by_two), Algorithm::rabenseifner);
  EXPECT_EQ(pick(4 << 10, &two_by_two), Algorithm::recursive_doubling);
  EXPECT_EQ(pick(64 << 10, &two_by_two), Algorithm::rabenseifner);
  // One rank per host: 24 KiB goes to Rabenseifner (on one host, recursive doubling); from
  // about 35 KiB one host's goes there too (64 KiB at W=4 took 1.26x less time by Rabenseifner
  // than by recursive doubling, BENCHMARKS.md).
  EXPECT_EQ(pick(24 << 10, nullptr), Algorithm::recursive_doubling);
  EXPECT_EQ(pick(24 << 10, &one_each), Algorithm::rabenseifner);
  EXPECT_EQ(pick(64 << 10, nullptr), Algorithm::rabenseifner);
  // Even a small allreduce depends on the layout: over two hosts of 512 ranks recursive
  // doubling would send 512 whole buffers across each link at its step between the hosts.
  std::vector<int> halves(1024);
  for (int r = 0; r < 1024; ++r) halves[r] = r < 512 ? 0 : 1;
  const HostTraffic big_hosts = host_traffic(halves);
  EXPECT_DOUBLE_EQ(big_hosts.recursive_doubling, 512.0);
  EXPECT_EQ(choose_algorithm(CollectiveKind::allreduce, 4 << 10, 1024, AlgorithmRequest::automatic,
                             model, 256 << 10, &big_hosts),
            Algorithm::rabenseifner);
  // Ranks that take turns on a core: the ring is left out of an automatic allreduce below
  // 8 MiB, and nothing else changes.
  HostTraffic crowded;
  crowded.shared_cores = true;
  EXPECT_EQ(pick(1 << 20, &crowded), Algorithm::rabenseifner);
  EXPECT_EQ(pick((8 << 20) - 4, &crowded), Algorithm::rabenseifner);
  EXPECT_EQ(pick(8 << 20, &crowded), Algorithm::ring);
  EXPECT_EQ(pick(64 << 20, &crowded), Algorithm::ring);
  EXPECT_EQ(pick(4 << 10, &crowded), Algorithm::recursive_doubling);
  EXPECT_EQ(choose_algorithm(CollectiveKind::reduce_scatter, 64 << 20, 4,
                             AlgorithmRequest::automatic, model, 256 << 10, &crowded),
            Algorithm::ring);
  EXPECT_EQ(choose_algorithm(CollectiveKind::allreduce, 64 << 20, 4, AlgorithmRequest::ring, model,
                             256 << 10, &crowded),
            Algorithm::ring);
  EXPECT_TRUE(choice_depends_on_hosts(CollectiveKind::allreduce, 4, AlgorithmRequest::automatic));
  EXPECT_FALSE(choice_depends_on_hosts(CollectiveKind::barrier, 4, AlgorithmRequest::automatic));
  EXPECT_FALSE(choice_depends_on_hosts(CollectiveKind::allreduce, 4, AlgorithmRequest::ring));
  EXPECT_FALSE(choice_depends_on_hosts(CollectiveKind::allreduce, 2, AlgorithmRequest::automatic));
}

// asio-ring learns where its ranks run at its first allreduce: over two hosts of two ranks a
// 1 MiB allreduce takes Rabenseifner, on one host the ring, and on one host whose four ranks
// share two CPUs Rabenseifner again; with the exact sum and the same bits on every rank.
TEST(AlgorithmChoice, AsioRingChoosesByWhereItsRanksRun) {
  constexpr int kWorld = 4;
  constexpr std::size_t kCount = (1 << 20) / sizeof(float);
  struct Case {
    HostLayout layout;
    const char* algorithm;
  };
  const Case cases[] = {
      {group_by_host({"a", "a", "b", "b"}), "rabenseifner"},
      {group_by_host(std::vector<std::string>(kWorld, "a")), "ring"},
      {group_by_host(std::vector<RankSite>(kWorld, RankSite{"a", "0-1"})), "rabenseifner"},
  };
  for (const Case& c : cases) {
    const HostLayout& layout = c.layout;
    testing::ScratchDir dir;
    std::vector<std::vector<float>> results(kWorld);
    std::vector<std::string> algorithms(kWorld);
    testing::run_ranks(kWorld, [&](int rank) {
      StoreOptions store_options;
      store_options.timeout = milliseconds(20000);
      auto store = open_store(dir.url(), store_options);
      CommOptions options;
      options.backend = "asio-ring";
      options.timeout = milliseconds(30000);
      auto comm = make_communicator(options, *store, RankHosts(layout), rank);
      std::vector<float> data(kCount);
      for (std::size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>(input_value(rank, i));
      comm->allreduce(Buffer{data.data(), kCount, DType::f32}, ReduceOp::sum);
      algorithms[rank] = comm->last_algorithm();
      results[rank] = std::move(data);
    });
    for (int rank = 0; rank < kWorld; ++rank) {
      EXPECT_EQ(algorithms[rank], c.algorithm) << rank;
      EXPECT_EQ(results[rank], results[0]) << "ranks 0 and " << rank << " differ";
    }
    for (std::size_t i = 0; i < kCount; ++i) {
      double want = 0;
      for (int r = 0; r < kWorld; ++r) want += input_value(r, i);
      ASSERT_EQ(results[0][i], static_cast<float>(want)) << i;
    }
  }
}

}  // namespace
}  // namespace partrain::comm
