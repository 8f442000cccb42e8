// Every backend x world size x element count x dtype x op, checked against a reference
// reduction computed here, with ranks as threads over a file store (and a tcp store).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "comm_backends/communicator.h"
#include "comm_backends/shm/shm_collectives.h"
#include "comm_backends/store/store.h"
#include "comm_backends/store/tcp_store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"
#include "tests/comm/reference_values.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

struct BackendSetup {
  std::string backend;
  int world;
  DType wire;
  std::size_t chunk_bytes;  // asio-ring pipeline chunk (0: default)
};

std::string setup_name(const ::testing::TestParamInfo<BackendSetup>& info) {
  std::string name =
      info.param.backend + "_w" + std::to_string(info.param.world) + "_wire_" +
      std::string(dtype_name(info.param.wire)) +
      (info.param.chunk_bytes ? "_chunk" + std::to_string(info.param.chunk_bytes) : std::string());
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

// Small integers with a sign, so sums stay exact even in bf16; avg adds fractions.
double input_value(int rank, std::size_t i) {
  return static_cast<double>(static_cast<int>((rank * 7 + i * 13) % 17) - 8);
}

double expected_value(int world, std::size_t i, ReduceOp op, DType dtype) {
  std::vector<double> values;
  for (int r = 0; r < world; ++r) values.push_back(input_value(r, i));
  return reduce_reference(values, op, dtype);
}

double tolerance(DType dtype, DType wire) {
  if (dtype == DType::bf16 || wire == DType::bf16) return 0.04;  // half an ulp at 8
  if (dtype == DType::f16 || wire == DType::f16) return 0.005;
  return 1e-5;
}

struct Case {
  DType dtype;
  ReduceOp op;
  std::size_t count;
};

// `chunk_bytes` is the ring's pipeline chunk (0: its default). The large case is a few MiB,
// enough for many default chunks; with a tiny chunk that would be thousands of messages a rank
// per step, which under Wine on a busy 2-core machine outlasts the timeout, so there it is 64
// chunks a rank, still far more than the pipeline's depth.
std::vector<Case> allreduce_cases(int world, std::size_t chunk_bytes) {
  std::vector<Case> cases;
  const std::size_t large = chunk_bytes != 0 && chunk_bytes < (64u << 10)
                                ? static_cast<std::size_t>(world) * 64 * chunk_bytes / 4 + 3
                                : (3u << 20) / 4 + 3;
  const std::vector<std::size_t> counts = {0, 1, static_cast<std::size_t>(world - 1), 1001};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
    for (std::size_t count : counts) cases.push_back({DType::f32, op, count});
  }
  cases.push_back({DType::f32, ReduceOp::sum, large});  // odd count
  for (DType dtype : {DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      for (std::size_t count : {std::size_t{1}, std::size_t{1001}})
        cases.push_back({dtype, op, count});
    }
  }
  return cases;
}

bool unsupported(const std::string& backend, DType dtype) {
  return backend == "gloo" && dtype == DType::bf16;
}

class Collectives : public ::testing::TestWithParam<BackendSetup> {
 protected:
  CommOptions comm_options() const {
    CommOptions options;
    options.backend = GetParam().backend;
    // Bounds a hang, not a speed: seven ranks under Wine on a busy machine are slow.
    options.timeout = milliseconds(60000);
    options.wire_dtype = GetParam().wire;
    options.token = "collective-test";
    options.ring_chunk_bytes = GetParam().chunk_bytes;
    return options;
  }
  StoreOptions store_options(int rank) const {
    StoreOptions options;
    options.token = "collective-test";
    options.timeout = milliseconds(20000);
    options.rank = rank;
    options.world_size = GetParam().world;
    return options;
  }
};

TEST_P(Collectives, AllreduceMatchesReference) {
  const BackendSetup setup = GetParam();
  const int world = setup.world;
  const auto cases = allreduce_cases(world, setup.chunk_bytes);
  testing::ScratchDir dir;
  // results[case][rank]: the raw bytes each rank ended with, to check that all agree bitwise.
  std::vector<std::vector<std::vector<std::uint8_t>>> results(
      cases.size(), std::vector<std::vector<std::uint8_t>>(world));
  std::atomic<int> wrong{0};
  testing::run_ranks(world, [&](int rank) {
    auto store = open_store(dir.url(), store_options(rank));
    auto comm = make_communicator(comm_options(), *store, rank, world);
    EXPECT_EQ(comm->rank(), rank);
    EXPECT_EQ(comm->size(), world);
    EXPECT_EQ(comm->name(), setup.backend);
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const Case& k = cases[c];
      std::vector<std::uint8_t> data(k.count * dtype_size(k.dtype) + 1);
      for (std::size_t i = 0; i < k.count; ++i)
        store_value(data.data(), k.dtype, i, input_value(rank, i));
      Buffer buffer{data.data(), k.count, k.dtype};
      if (unsupported(setup.backend, k.dtype) && world > 1) {
        EXPECT_THROW(comm->allreduce(buffer, k.op), UsageError);
        continue;
      }
      comm->allreduce(buffer, k.op);
      int bad = 0;
      for (std::size_t i = 0; i < k.count; ++i) {
        const double want = expected_value(world, i, k.op, k.dtype);
        const double got = load_value(data.data(), k.dtype, i);
        if (std::abs(got - want) > tolerance(k.dtype, setup.wire) * std::max(1.0, std::abs(want))) {
          if (++bad <= 3) {
            ADD_FAILURE() << "rank " << rank << " " << dtype_name(k.dtype) << " "
                          << reduce_op_name(k.op) << " count " << k.count << " [" << i << "]: got "
                          << got << ", want " << want;
          }
        }
      }
      wrong += bad;
      data.resize(k.count * dtype_size(k.dtype));
      results[c][rank] = std::move(data);
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  for (std::size_t c = 0; c < cases.size(); ++c) {
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(results[c][r], results[c][0])
          << "ranks 0 and " << r << " disagree on case " << c << " (" << dtype_name(cases[c].dtype)
          << " " << reduce_op_name(cases[c].op) << ")";
    }
  }
}

// Rank r gets the reduction of block r, the input stays as it was; every dtype, several ops,
// counts around the block boundaries.
TEST_P(Collectives, ReduceScatterMatchesReference) {
  const BackendSetup setup = GetParam();
  const int world = setup.world;
  testing::ScratchDir dir;
  std::atomic<int> wrong{0};
  testing::run_ranks(world, [&](int rank) {
    auto store = open_store(dir.url(), store_options(rank));
    auto comm = make_communicator(comm_options(), *store, rank, world);
    for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1001}}) {
          const std::size_t elem = dtype_size(dtype);
          std::vector<std::uint8_t> in(count * world * elem), out(count * elem);
          for (std::size_t i = 0; i < count * world; ++i) {
            store_value(in.data(), dtype, i, input_value(rank, i));
          }
          const auto before = in;
          const Buffer input{in.data(), count * world, dtype}, output{out.data(), count, dtype};
          if (unsupported(setup.backend, dtype) && world > 1) {
            EXPECT_THROW(comm->reduce_scatter(input, output, op), UsageError);
            continue;
          }
          comm->reduce_scatter(input, output, op);
          EXPECT_EQ(in, before) << "the input changed";
          for (std::size_t i = 0; i < count; ++i) {
            const double want = expected_value(world, rank * count + i, op, dtype);
            const double got = load_value(out.data(), dtype, i);
            if (std::abs(got - want) >
                    tolerance(dtype, setup.wire) * std::max(1.0, std::abs(want)) &&
                ++wrong <= 3) {
              ADD_FAILURE() << "rank " << rank << " " << dtype_name(dtype) << " "
                            << reduce_op_name(op) << " count " << count << " [" << i << "]: got "
                            << got << ", want " << want;
            }
          }
        }
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST_P(Collectives, BroadcastAllgatherBarrier) {
  const int world = GetParam().world;
  testing::ScratchDir dir;
  std::atomic<int> arrived{0};
  testing::run_ranks(world, [&](int rank) {
    auto store = open_store(dir.url(), store_options(rank));
    auto comm = make_communicator(comm_options(), *store, rank, world);
    for (int root : {0, world - 1}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{70001}}) {
        std::vector<float> data(count, -1.0f);
        if (rank == root) {
          for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(root * 100000 + i);
        }
        comm->broadcast(Buffer{data.data(), count, DType::f32}, root);
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(data[i], static_cast<float>(root * 100000 + i))
              << "rank " << rank << " root " << root;
        }
      }
    }
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{777}}) {
      std::vector<std::int64_t> in(count), out(count * world, -1);
      for (std::size_t i = 0; i < count; ++i) in[i] = rank * 1000000 + static_cast<std::int64_t>(i);
      comm->allgather(Buffer{in.data(), count, DType::i64},
                      Buffer{out.data(), out.size(), DType::i64});
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r * count + i], r * 1000000 + static_cast<std::int64_t>(i));
        }
      }
    }
    // In place: the input is this rank's block of the output.
    for (std::size_t count : {std::size_t{1}, std::size_t{777}}) {
      std::vector<std::int64_t> out(count * world, -1);
      for (std::size_t i = 0; i < count; ++i) {
        out[rank * count + i] = rank * 1000000 + static_cast<std::int64_t>(i);
      }
      comm->allgather(Buffer{out.data() + rank * count, count, DType::i64},
                      Buffer{out.data(), out.size(), DType::i64});
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[r * count + i], r * 1000000 + static_cast<std::int64_t>(i)) << "in place";
        }
      }
    }
    std::vector<std::int64_t> in(3), wrong_out(3 * world + 1);
    EXPECT_THROW(comm->allgather(Buffer{in.data(), 3, DType::i64},
                                 Buffer{wrong_out.data(), wrong_out.size(), DType::i64}),
                 UsageError);
    // Overlapping the output anywhere but exactly this rank's block is refused.
    std::vector<std::int64_t> out(3 * world + 2);
    EXPECT_THROW(
        comm->allgather(Buffer{out.data() + 3 * rank + 1, 3, DType::i64},
                        Buffer{out.data(), 3 * static_cast<std::size_t>(world), DType::i64}),
        UsageError);
    for (int round = 1; round <= 3; ++round) {
      arrived.fetch_add(1);
      comm->barrier();
      // Nobody leaves a barrier before everyone has reached it.
      EXPECT_GE(arrived.load(), round * world);
      comm->barrier();
    }
  });
}

std::vector<BackendSetup> setups() {
  std::vector<BackendSetup> list;
  for (int world : {1, 2, 3, 4, 7}) {
    list.push_back({"asio-ring", world, DType::f32, 1000});  // many odd-sized chunks
    list.push_back({"asio-ring", world, DType::bf16, 0});
  }
  list.push_back({"asio-ring", 3, DType::f16, 0});
  for (int world : {1, 2, 3, 4, 7}) {
    list.push_back({"shm", world, DType::f32, 0});
    list.push_back({"shm", world, DType::bf16, 0});
  }
  list.push_back({"shm", 3, DType::f16, 0});
  // All ranks on this host: the hierarchical backend is its host part alone (ranks on
  // several hosts: hierarchical_test.cpp).
  for (int world : {1, 2, 3}) list.push_back({"hierarchical", world, DType::f32, 0});
  list.push_back({"hierarchical", 4, DType::bf16, 0});
#ifdef PARTRAIN_WITH_GLOO
  for (int world : {1, 2, 3, 4, 7}) list.push_back({"gloo", world, DType::f32, 0});
#endif
  return list;
}

INSTANTIATE_TEST_SUITE_P(Backends, Collectives, ::testing::ValuesIn(setups()), setup_name);

// The same allreduce over the tcp store, hosted by rank 0.
TEST(CollectivesOverTcpStore, RingAndGlooRendezvous) {
  constexpr int kWorld = 3;
  std::vector<std::string> backends = {"asio-ring"};
#ifdef PARTRAIN_WITH_GLOO
  backends.push_back("gloo");
#endif
  StoreOptions host_options;
  host_options.token = "tcp-test";
  host_options.timeout = milliseconds(10000);
  host_options.host_server = true;
  TcpStore host("127.0.0.1", 0, host_options);
  for (const auto& backend : backends) {
    testing::run_ranks(kWorld, [&](int rank) {
      StoreOptions options = host_options;
      options.host_server = false;
      options.rank = rank;
      auto store = open_store("tcp://127.0.0.1:" + std::to_string(host.port()), options);
      CommOptions comm_options;
      comm_options.backend = backend;
      comm_options.timeout = milliseconds(10000);
      auto comm = make_communicator(comm_options, *store, rank, kWorld);
      std::vector<double> data(4099);
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = input_value(rank, i);
      comm->allreduce(Buffer{data.data(), data.size(), DType::f64}, ReduceOp::sum);
      for (std::size_t i = 0; i < data.size(); ++i) {
        ASSERT_EQ(data[i], expected_value(kWorld, i, ReduceOp::sum, DType::f64)) << backend;
      }
    });
  }
}

// Ranks on hosts as `host_of_rank` says; no store needed.
RankHosts hosts_on(const std::vector<int>& host_of_rank) {
  std::vector<std::string> identities;
  for (int host : host_of_rank) identities.push_back("host " + std::to_string(host));
  return RankHosts(group_by_host(identities));
}

// auto's rule is the order of the backend list: the first compiled in and usable wins.
TEST(Communicator, AutoTakesTheFirstUsableBackendForThePlacement) {
  const auto cpu = DeviceKind::cpu;
  EXPECT_EQ(choose_backend("auto", Placement{cpu, hosts_on({0})}), "asio-ring");
  EXPECT_EQ(choose_backend("auto", Placement{cpu, hosts_on({0, 0, 0})}), "shm");
  EXPECT_EQ(choose_backend("auto", Placement{cpu, hosts_on({0, 0, 1})}), "hierarchical");
  EXPECT_EQ(choose_backend("auto", Placement{cpu, hosts_on({0, 1, 0, 1})}), "hierarchical");
  EXPECT_EQ(choose_backend("auto", Placement{cpu, hosts_on({0, 1, 2})}), "asio-ring");
  // CUDA buffers: nccl where it is compiled in (Linux), else the host backends (the callers
  // stage the buffers through host memory) by the same rule.
  const auto cuda = DeviceKind::cuda;
  const bool nccl = backend_compiled_in("nccl");
  EXPECT_EQ(choose_backend("auto", Placement{cuda, hosts_on({0})}), nccl ? "nccl" : "asio-ring");
  EXPECT_EQ(choose_backend("auto", Placement{cuda, hosts_on({0, 0})}), nccl ? "nccl" : "shm");
  EXPECT_EQ(choose_backend("auto", Placement{cuda, hosts_on({0, 0, 1})}),
            nccl ? "nccl" : "hierarchical");
  // A name is that backend, wherever the ranks run.
  for (const auto& name : backend_names()) {
    if (name != "auto") {
      EXPECT_EQ(choose_backend(name, Placement{cpu, hosts_on({0, 1})}), name);
    }
  }
  EXPECT_THROW(choose_backend("mpi", Placement{cpu, hosts_on({0})}), UsageError);
}

// Where a host's /dev/shm has no room for the region its ranks would share, auto leaves shm and
// hierarchical alone and says why; where the room is not known, it does not.
TEST(Communicator, AutoLeavesSharedMemoryWhereTheRegionDoesNotFit) {
  // What auto takes for ranks at these sites (a Placement only refers to its RankHosts).
  auto chosen = [](const std::vector<RankSite>& sites) {
    const RankHosts hosts(group_by_host(sites));
    return choose_backend("auto", Placement{DeviceKind::cpu, hosts});
  };
  const std::uint64_t fits = shm_region_bytes(3), short_of = shm_region_bytes(3) - 1;
  EXPECT_EQ(chosen({{"a", "", fits}, {"a", "", fits}, {"a", "", fits}}), "shm");
  const std::uint64_t unknown = kShmRoomUnknown;
  EXPECT_EQ(chosen({{"a", "", unknown}, {"a", "", unknown}, {"a", "", unknown}}), "shm");
  EXPECT_EQ(chosen({{"a", "", unknown}, {"a", "", 0}, {"a", "", unknown}}), "asio-ring");  // full
  const std::vector<RankSite> cramped = {{"a", "", fits}, {"a", "", short_of}, {"a", "", fits}};
  EXPECT_EQ(chosen(cramped), "asio-ring");
  const RankHosts cramped_hosts(group_by_host(cramped));
  std::string why_not_shm;
  for (const auto& status : probe_backends(Placement{DeviceKind::cpu, cramped_hosts})) {
    if (status.name == "shm") why_not_shm = status.why_not;
  }
  EXPECT_NE(why_not_shm.find("does not fit in /dev/shm"), std::string::npos) << why_not_shm;
  // Two hosts of three ranks each; the second's room is short of a region for three.
  const std::vector<RankSite> two_hosts = {{"a", "", fits},     {"a", "", fits},
                                           {"a", "", fits},     {"b", "", short_of},
                                           {"b", "", short_of}, {"b", "", short_of}};
  EXPECT_EQ(chosen(two_hosts), "asio-ring");
  // A container's /dev/shm of 64 MiB (Docker's default) holds the region of 64 ranks.
  const std::uint64_t container = std::uint64_t{64} << 20;
  EXPECT_EQ(chosen(std::vector<RankSite>(64, RankSite{"a", "", container})), "shm");
  auto roomy = two_hosts;
  for (auto& site : roomy) site.shm_room = fits;
  EXPECT_EQ(chosen(roomy), "hierarchical");
}

// Each backend says why auto leaves it alone for a placement, in the order auto asks.
TEST(Communicator, ProbeSaysWhyNotForEachBackend) {
  std::vector<std::string> order;
  std::map<std::string, BackendStatus> one_host, two_hosts;
  for (const auto& status : probe_backends(Placement{DeviceKind::cpu, hosts_on({0, 0})})) {
    order.push_back(status.name);
    one_host[status.name] = status;
  }
  for (const auto& status : probe_backends(Placement{DeviceKind::cpu, hosts_on({0, 1})})) {
    two_hosts[status.name] = status;
  }
  std::vector<std::string> names = backend_names();
  names.pop_back();  // auto
  EXPECT_EQ(order, names);
  EXPECT_EQ(order, (std::vector<std::string>{"nccl", "shm", "hierarchical", "asio-ring", "gloo"}));
  for (const auto& [name, status] : one_host) {
    EXPECT_EQ(status.compiled_in, backend_compiled_in(name)) << name;
    if (!status.compiled_in) {
      EXPECT_NE(status.why_not.find("asio-ring"), std::string::npos) << status.why_not;
    }
  }
  EXPECT_EQ(one_host["shm"].why_not, "");
  EXPECT_EQ(one_host["asio-ring"].why_not, "");
  EXPECT_NE(one_host["hierarchical"].why_not.find("one host"), std::string::npos);
  EXPECT_NE(two_hosts["shm"].why_not.find("2 hosts"), std::string::npos);
  EXPECT_NE(two_hosts["hierarchical"].why_not.find("one rank per host"), std::string::npos);
  EXPECT_EQ(two_hosts["asio-ring"].why_not, "");
  if (one_host["nccl"].compiled_in) {
    EXPECT_NE(one_host["nccl"].why_not.find("no CUDA device"), std::string::npos);
  }
  if (one_host["gloo"].compiled_in) {
    EXPECT_EQ(one_host["gloo"].why_not, "");
  }
}

// Named for ranks on two hosts, shm refuses at once and says which rank runs elsewhere.
TEST(Communicator, ShmForRanksOnTwoHostsNamesTheRankElsewhere) {
  testing::ScratchDir dir;
  auto store = open_store(dir.url(), StoreOptions{});
  CommOptions options;
  options.backend = "shm";
  try {
    make_communicator(options, *store, hosts_on({0, 0, 1}), 1);
    FAIL() << "shm accepted ranks on two hosts";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 runs on 'host 1' and rank 1 on 'host 0'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Communicator, BackendNamesAndClearErrors) {
  const auto names = backend_names();
  for (const char* name : {"gloo", "asio-ring", "nccl", "auto"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  CommOptions options;
  testing::ScratchDir dir;
  auto store = open_store(dir.url(), StoreOptions{});
  options.backend = "mpi";
  try {
    make_communicator(options, *store, 0, 1);
    FAIL() << "unknown backend accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("asio-ring"), std::string::npos) << e.what();
  }
  for (const auto& name : names) {  // gloo and nccl, in builds without them
    if (backend_compiled_in(name)) continue;
    options.backend = name;
    try {
      make_communicator(options, *store, 0, 1);
      FAIL() << name << " is not compiled in, yet made a communicator";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("is not compiled into this build: "), std::string::npos)
          << e.what();
    }
  }
  options.backend = "asio-ring";
  EXPECT_THROW(make_communicator(options, *store, 2, 2), UsageError);
  options.wire_dtype = DType::i32;
  EXPECT_THROW(make_communicator(options, *store, 0, 1), UsageError);
  options.wire_dtype = DType::f32;
  auto comm = make_communicator(options, *store, 0, 1);
  float x = 1;
  EXPECT_THROW(comm->allreduce(Buffer{&x, 1, DType::f32, DeviceKind::cuda}, ReduceOp::sum),
               UsageError);
}

}  // namespace
}  // namespace partrain::comm
