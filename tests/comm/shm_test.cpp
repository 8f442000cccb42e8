// The shm backend against asio-ring's ring algorithm: the same inputs give the same bits, for
// every dtype, op and wire, at world sizes 2-4 and at sizes that take several pieces (where
// asio-ring's own choice is the ring too); ranks that call different collectives fail with a
// message; nothing stays in /dev/shm.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

#if defined(__linux__)
#include <sched.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#endif

#include "comm_backends/communicator.h"
#include "comm_backends/shm/host_identity.h"
#include "comm_backends/shm/shm_collectives.h"
#include "comm_backends/shm/shm_region.h"
#include "comm_backends/store/store.h"
#include "common/cpu_list.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/stop_request.h"
#include "tests/support/cross_memory.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

// Values that make the order of the reduction show: random magnitudes over many binades,
// so that a sum in another order rounds differently.
std::vector<std::uint8_t> random_input(DType dtype, std::size_t count, int rank) {
  std::mt19937_64 random(1000 + rank * 7919 + static_cast<int>(dtype));
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<double> values(count);
  for (auto& v : values) v = std::ldexp(mantissa(random), exponent(random));
  // Zeros of the rank's own sign here and there: min and max of +0 and -0 give the operand
  // that comes first, so they show whether values meet in the ring's order.
  for (std::size_t i = 0; i < count; i += 97) values[i] = rank % 2 == 0 ? 0.0 : -0.0;
  std::vector<std::uint8_t> bytes(count * dtype_size(dtype));
  if (dtype == DType::i32 || dtype == DType::i64) {
    for (std::size_t i = 0; i < count; ++i) {
      const auto v = static_cast<std::int64_t>(values[i] * 1000);
      if (dtype == DType::i32) {
        const auto v32 = static_cast<std::int32_t>(v);
        std::memcpy(bytes.data() + 4 * i, &v32, 4);
      } else {
        std::memcpy(bytes.data() + 8 * i, &v, 8);
      }
    }
  } else {
    convert_elements(values.data(), DType::f64, bytes.data(), dtype, count);
  }
  return bytes;
}

// One rank's store over the file store in `dir`.
std::unique_ptr<Store> rank_store(const testing::ScratchDir& dir, int rank, int world,
                                  milliseconds timeout = StoreOptions{}.timeout) {
  StoreOptions so;
  so.rank = rank;
  so.world_size = world;
  so.timeout = timeout;
  return open_store(dir.url(), so);
}

// One rank's store and communicator over the file store in `dir`.
struct RankComm {
  std::unique_ptr<Store> store;
  std::unique_ptr<Communicator> comm;
};
RankComm connect(const testing::ScratchDir& dir, int rank, int world, const CommOptions& options,
                 milliseconds store_timeout = StoreOptions{}.timeout) {
  RankComm r;
  r.store = rank_store(dir, rank, world, store_timeout);
  r.comm = make_communicator(options, *r.store, rank, world);
  return r;
}

// Each rank's allreduce result with `backend`.
std::vector<std::vector<std::uint8_t>> allreduce_with(const std::string& backend, int world,
                                                      DType dtype, ReduceOp op, DType wire,
                                                      std::size_t count,
                                                      const std::string& algorithm = "auto",
                                                      const std::string& token = "") {
  testing::ScratchDir dir;
  std::vector<std::vector<std::uint8_t>> results(world);
  testing::run_ranks(world, [&](int rank) {
    CommOptions options;
    options.backend = backend;
    options.timeout = milliseconds(20000);
    options.wire_dtype = wire;
    options.token = token;
    options.algorithm = algorithm;
    auto [store, comm] = connect(dir, rank, world, options, milliseconds(20000));
    results[rank] = random_input(dtype, count, rank);
    comm->allreduce({results[rank].data(), count, dtype}, op);
  });
  return results;
}

struct Case {
  DType dtype;
  ReduceOp op;
  DType wire;
};

TEST(Shm, AllreduceHasTheRingsBitsForEveryDtypeOpAndWire) {
  std::vector<Case> cases;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
      cases.push_back({dtype, op, DType::f32});
    }
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (DType wire : {DType::bf16, DType::f16}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        cases.push_back({dtype, op, wire});
      }
    }
  }
  for (int world : {2, 3, 4}) {
    for (const Case& c : cases) {
      const std::size_t count = 1237;  // segments of unequal length
      const auto ring = allreduce_with("asio-ring", world, c.dtype, c.op, c.wire, count, "ring");
      const auto shm = allreduce_with("shm", world, c.dtype, c.op, c.wire, count);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(shm[r], ring[r])
            << "world " << world << " rank " << r << " " << dtype_name(c.dtype) << " "
            << reduce_op_name(c.op) << " wire " << dtype_name(c.wire);
      }
      EXPECT_EQ(shm[0], shm[world - 1]) << "ranks differ";
    }
  }
}

TEST(Shm, LargeAllreduceRunsInPiecesWithTheSameBits) {
  // 3 slots' worth of f32 and a ragged end: pieces cut across the ring's segments. That large,
  // asio-ring's auto takes the ring where each rank has a core of its own, and (below 8 MiB)
  // Rabenseifner where three ranks share fewer cores (Note [Choosing an algorithm]): the ring
  // is forced, so that the test asks the same of every machine.
  const std::size_t count = 3 * kShmSlotBytes / 4 + 12345;
  for (DType wire : {DType::f32, DType::bf16}) {
    const auto ring =
        allreduce_with("asio-ring", 3, DType::f32, ReduceOp::sum, wire, count, "ring");
    const auto shm = allreduce_with("shm", 3, DType::f32, ReduceOp::sum, wire, count);
    for (int r = 0; r < 3; ++r) EXPECT_TRUE(shm[r] == ring[r]) << "rank " << r;
  }
}

// An allreduce of data in its own type goes in pieces of 256 KiB, whichever its element size,
// and a piece's shares need not meet the ring's segments: about two and a half pieces of
// 8-byte elements under min and max (whose operand order shows) at two and four ranks, and
// counts smaller than the world, where some ranks have no share.
TEST(Shm, AllreduceOfEveryElementSizeHasTheRingsBitsAcrossPieces) {
  for (int world : {2, 4}) {
    for (DType dtype : {DType::f64, DType::i64, DType::i32}) {
      for (ReduceOp op : {ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
        const std::size_t pieces = (640 << 10) / dtype_size(dtype) + 77;  // 2.5 pieces and more
        for (std::size_t count : {pieces, std::size_t{1}, static_cast<std::size_t>(world - 1)}) {
          if (count == 0) continue;
          const auto ring =
              allreduce_with("asio-ring", world, dtype, op, DType::f32, count, "ring");
          const auto shm = allreduce_with("shm", world, dtype, op, DType::f32, count);
          for (int r = 0; r < world; ++r) {
            EXPECT_TRUE(shm[r] == ring[r])
                << "world " << world << " rank " << r << " " << dtype_name(dtype) << " "
                << reduce_op_name(op) << " count " << count;
          }
        }
      }
    }
  }
}

// Each rank's reduce_scatter output with `backend` (asio-ring's ring: the order it promises).
std::vector<std::vector<std::uint8_t>> reduce_scatter_with(const std::string& backend, int world,
                                                           DType dtype, ReduceOp op, DType wire,
                                                           std::size_t count) {
  testing::ScratchDir dir;
  std::vector<std::vector<std::uint8_t>> results(world);
  testing::run_ranks(world, [&](int rank) {
    CommOptions options;
    options.backend = backend;
    options.algorithm = "ring";
    options.timeout = milliseconds(20000);
    options.wire_dtype = wire;
    auto [store, comm] = connect(dir, rank, world, options, milliseconds(20000));
    const auto in = random_input(dtype, count * world, rank);
    const auto in_before = in;
    results[rank].resize(count * dtype_size(dtype));
    comm->reduce_scatter(Buffer{const_cast<std::uint8_t*>(in.data()), count * world, dtype},
                         Buffer{results[rank].data(), count, dtype}, op);
    EXPECT_TRUE(in == in_before) << backend << " rank " << rank << " changed its input";
  });
  return results;
}

// reduce_scatter reduces each block in the ring's order too: the bits of asio-ring's ring.
// Values reduced in their own type (f32), in a wider type (bf16) and on a narrow wire, over
// several pieces.
TEST(Shm, ReduceScatterHasTheRingsBits) {
  for (int world : {2, 3, 4}) {
    for (const auto& [dtype, wire] :
         {std::pair{DType::f32, DType::f32}, std::pair{DType::bf16, DType::f32},
          std::pair{DType::f32, DType::bf16}}) {
      // Enough per rank for several pieces at three ranks, with a ragged end.
      const std::size_t count = kShmSlotBytes / 4 / 3 * 2 + 101;
      const auto ring = reduce_scatter_with("asio-ring", world, dtype, ReduceOp::avg, wire, count);
      const auto shm = reduce_scatter_with("shm", world, dtype, ReduceOp::avg, wire, count);
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(shm[r] == ring[r]) << "world " << world << " rank " << r << " "
                                       << dtype_name(dtype) << " wire " << dtype_name(wire);
      }
    }
  }
}

// Data reduced in its own type goes in pieces that hold 256 KiB of the input in all, the same
// elements of every block: about two and a half pieces of each element size under min and max
// (whose operand order shows, with zeros of both signs) and avg, at two, three and four ranks,
// and blocks of one element.
TEST(Shm, ReduceScatterOfEveryElementSizeHasTheRingsBitsAcrossPieces) {
  for (int world : {2, 3, 4}) {
    for (DType dtype : {DType::f32, DType::f64, DType::i64, DType::i32}) {
      for (ReduceOp op : {ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
        const std::size_t pieces = (640 << 10) / dtype_size(dtype) / world + 77;
        for (std::size_t count : {pieces, std::size_t{1}}) {
          const auto ring = reduce_scatter_with("asio-ring", world, dtype, op, DType::f32, count);
          const auto shm = reduce_scatter_with("shm", world, dtype, op, DType::f32, count);
          for (int r = 0; r < world; ++r) {
            EXPECT_TRUE(shm[r] == ring[r])
                << "world " << world << " rank " << r << " " << dtype_name(dtype) << " "
                << reduce_op_name(op) << " count " << count;
          }
        }
      }
    }
  }
}

// At two and three ranks: on a machine of two CPUs the three share cores, and the allgather
// then copies a rank's own block in one go instead of with each piece.
TEST(Shm, LargeBroadcastAndAllgather) {
  for (const int world : {2, 3}) {
    const std::size_t bytes = kShmStreamBytes * 2 + 77;  // twice round the stream
    testing::ScratchDir dir;
    testing::run_ranks(world, [&](int rank) {
      CommOptions options;
      options.backend = "shm";
      options.timeout = milliseconds(20000);
      auto [store, comm] = connect(dir, rank, world, options);
      std::vector<std::uint8_t> data(bytes, static_cast<std::uint8_t>(rank));
      if (rank == 1) {
        for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::uint8_t>(i * 31);
      }
      comm->broadcast({data.data(), bytes / 4, DType::i32}, 1);
      for (std::size_t i = 0; i < bytes / 4 * 4; ++i) {
        ASSERT_EQ(data[i], static_cast<std::uint8_t>(i * 31)) << "rank " << rank << " byte " << i;
      }
      // Several pieces a rank, from a buffer of its own and in place (this rank's block of the
      // output as its input).
      const std::size_t n = kShmSlotBytes / 8 + 3;
      auto value = [](int r, std::size_t i) { return std::int64_t{r} * 1000003 + 7 * i; };
      std::vector<std::int64_t> mine(n), all(n * world, -1), in_place(n * world, -1);
      for (std::size_t i = 0; i < n; ++i) mine[i] = in_place[rank * n + i] = value(rank, i);
      comm->allgather({mine.data(), n, DType::i64}, {all.data(), all.size(), DType::i64});
      comm->allgather({in_place.data() + rank * n, n, DType::i64},
                      {in_place.data(), in_place.size(), DType::i64});
      for (int r = 0; r < world; ++r) {
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(all[r * n + i], value(r, i)) << "rank " << rank << " block " << r << " " << i;
        }
      }
      EXPECT_TRUE(in_place == all) << "rank " << rank;
    });
  }
}

// Rank 1 broadcasts while rank 0 allreduces: as a rank that reads the root's stream, and as
// the root.
TEST(Shm, RanksCallingDifferentCollectivesFailWithAMessage) {
  const int world = 2;
  for (const int root : {0, 1}) {
    testing::ScratchDir dir;
    std::vector<std::string> errors(world);
    testing::run_ranks(world, [&](int rank) {
      CommOptions options;
      options.backend = "shm";
      options.timeout = milliseconds(3000);
      auto [store, comm] = connect(dir, rank, world, options);
      float value = 1;
      try {
        if (rank == 0) {
          comm->allreduce({&value, 1, DType::f32}, ReduceOp::sum);
        } else {
          comm->broadcast({&value, 1, DType::f32}, root);
        }
      } catch (const Error& e) {
        errors[rank] = e.what();
      }
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_NE(errors[r].find("ranks disagree"), std::string::npos)
          << "root " << root << ": " << errors[r];
    }
  }
}

// A rank 0 that cannot make the region tells the others why, and they fail at once rather
// than when their wait for the region's name runs out (20 s here).
TEST(Shm, RankZeroThatCannotMakeTheRegionStopsTheOthersAtOnce) {
  const int world = 3;
  testing::ScratchDir dir;
  std::vector<std::string> errors(world);
  std::vector<milliseconds> took(world);
  testing::run_ranks(world, [&](int rank) {
    auto store = rank_store(dir, rank, world, milliseconds(20000));
    const auto start = std::chrono::steady_clock::now();
    try {
      ShmRegion region(*store, "test/", "token", rank, world, 1 << 20, milliseconds(20000),
                       [&](void*) {
                         if (rank == 0) throw CommError("no room made up for the test");
                       });
    } catch (const CommError& e) {
      errors[rank] = e.what();
    }
    took[rank] = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
  });
  EXPECT_EQ(errors[0], "no room made up for the test");
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(errors[r],
              "shm: rank 0 could not make the shared region: no room made up for the test");
    EXPECT_LT(took[r], milliseconds(10000)) << "rank " << r;
  }
}

// A rank whose build lays the region out at another size than rank 0's made it stops before it
// maps it (mapping more would fault past the end), saying why.
#if defined(__linux__)
// Rank 0 keeps the region's name in /dev/shm until every rank has mapped it. A stop that ends
// it at once meanwhile (a stop in the start-up, StopRequest: no destructor runs) removes the
// name first, as an ordinary exit would: it does not stay in RAM until the next boot.
TEST(ShmDeathTest, AStopWhileTheOthersAttachLeavesNoRegion) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string token = "abrupt-stop-region";
  std::ostringstream stem;
  stem << "partrain-shm-" << std::hex << fnv1a_64(token) << "-";
  const auto left = [&] {
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      count += entry.path().filename().string().starts_with(stem.str()) ? 1 : 0;
    }
    return count;
  };
  ASSERT_EQ(left(), 0);
  testing::ScratchDir dir;
  EXPECT_EXIT(
      {
        StopRequest stop(/*in_start_up=*/true);
        // A store of one: opening one of two would wait for rank 1 first.
        const auto store = rank_store(dir, 0, 1, milliseconds(10000));
        // Once the region is there (bounded: 10 s), while rank 0 waits for rank 1, which never
        // comes; the exit code says the stop, not the region's own timeout, ended it.
        std::thread([&left] {
          for (int i = 0; i < 1000 && left() == 0; ++i)
            std::this_thread::sleep_for(milliseconds(10));
          std::fprintf(stderr, "region seen: %d\n", left());
          ::kill(::getpid(), SIGTERM);
        }).detach();
        ShmRegion region(*store, "p", token, 0, 2, 1 << 16, milliseconds(10000), [](void*) {});
        std::_Exit(0);  // not reached: rank 1 never attaches
      },
      ::testing::ExitedWithCode(kExitStopped),
      "region seen: 1\npartrain: stopped during start-up by SIGTERM");
  EXPECT_EQ(left(), 0);
}
#endif

TEST(Shm, ARankOfABuildThatSizesTheRegionOtherwiseIsRefused) {
  const int world = 2;
  testing::ScratchDir dir;
  std::vector<std::string> errors(world);
  testing::run_ranks(world, [&](int rank) {
    auto store = rank_store(dir, rank, world, milliseconds(20000));
    const std::size_t bytes = std::size_t{1} << (rank == 0 ? 20 : 21);
    try {  // rank 0 waits for rank 1 to attach, which it never does
      ShmRegion region(*store, "test/", "token", rank, world, bytes, milliseconds(1000),
                       [](void*) {});
    } catch (const CommError& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_EQ(errors[1],
            "shm: rank 0 made a shared region of 1048576 bytes, and this rank's build lays out "
            "2097152: run the same build on every rank");
  EXPECT_FALSE(errors[0].empty());
}

TEST(Shm, AutoPicksShmWhenEveryRankSharesTheHost) {
  const int world = 3;
  testing::ScratchDir dir;
  std::vector<std::string> names(world);
  testing::run_ranks(world, [&](int rank) {
    auto [store, comm] = connect(dir, rank, world, CommOptions{});  // auto, CPU buffers
    names[rank] = comm->name();
    float value = static_cast<float>(rank);
    comm->allreduce({&value, 1, DType::f32}, ReduceOp::sum);
    EXPECT_EQ(value, 3.0f);
  });
  for (const auto& name : names) EXPECT_EQ(name, "shm");
}

// A region in zeroed pages of this process and one ShmCollectives a rank over it, rank 0 first
// (it lays out the region), for ranks that run as threads of this process; options_of(rank)
// gives each rank's options, with a timeout of 20 s.
// Keeps the calling thread on CPU `cpu` (Linux; -1: leaves it where it may run). Best effort:
// the tests that call it must hold wherever their threads run.
void hold_this_thread_to(int cpu) {
#if defined(__linux__)
  if (cpu < 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  sched_setaffinity(0, sizeof one, &one);
#else
  (void)cpu;
#endif
}

struct RanksInThisProcess {
  struct alignas(4096) Page {
    std::uint8_t bytes[4096];
  };
  std::vector<Page> region;
  std::vector<std::unique_ptr<ShmCollectives>> ranks;

  RanksInThisProcess(int world, const std::function<void(int rank, ShmOptions&)>& options_of)
      : region((shm_region_bytes(world) + 4095) / 4096, Page{}) {
    for (int r = 0; r < world; ++r) {
      ShmOptions options;
      options.timeout = milliseconds(20000);
      options_of(r, options);
      ranks.push_back(std::make_unique<ShmCollectives>(region.data(), r, world, options));
    }
  }
  ShmCollectives& operator[](int rank) { return *ranks[static_cast<std::size_t>(rank)]; }
};

// Whether ranks share cores decides how a broadcast goes, so all must say the same: a rank that
// says otherwise than rank 0 is refused when it joins, naming itself.
TEST(Shm, RanksThatDisagreeOnSharingCoresAreRefused) {
  try {
    RanksInThisProcess ranks(2, [](int r, ShmOptions& options) { options.shared_cores = r == 1; });
    ADD_FAILURE() << "rank 1 joined";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 shares cores"), std::string::npos) << e.what();
  }
}

// Ranks that share cores wait by yielding from the first round, and the allgather copies a
// rank's own block in one go, through the slots (ShmOptions::shared_cores): three ranks held to one
// CPU, each collective several pieces long, still end with the exact results. The region is zeroed
// pages of this process, the ranks its threads.
TEST(Shm, RanksOnOneCpuThatYieldAtOnceAgree) {
  const int world = 3;
  RanksInThisProcess ranks(world, [](int, ShmOptions& options) { options.shared_cores = true; });
  const std::size_t count = 3 * kShmSlotBytes / 4 + 1001;  // several pieces of every collective
#if defined(__linux__)
  const int cpu = sched_getcpu();
#else
  const int cpu = -1;
#endif
  testing::run_ranks(world, [&](int rank) {
    hold_this_thread_to(cpu);
    ShmCollectives& shm = ranks[rank];
    for (int round = 0; round < 3; ++round) {
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + i % 7);
      shm.allreduce(data.data(), count, DType::f32, ReduceOp::sum, DType::f32);
      for (std::size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(data[i], static_cast<float>(3 + 3 * (i % 7))) << "allreduce, element " << i;
      }
      std::vector<float> out(count / world);
      shm.reduce_scatter(data.data(), out.data(), out.size(), DType::f32, ReduceOp::max,
                         DType::f32);
      for (std::size_t i = 0; i < out.size(); i += 997) {
        ASSERT_EQ(out[i], data[rank * out.size() + i]) << "reduce_scatter, element " << i;
      }
      std::vector<float> all(out.size() * world);
      shm.allgather(out.data(), all.data(), out.size() * sizeof(float));
      ASSERT_FALSE(shm.last_was_single_copy()) << "ranks that share cores keep to the slots";
      for (std::size_t i = 0; i < all.size(); i += 997) {
        ASSERT_EQ(all[i], data[i]) << "allgather, element " << i;
      }
      std::vector<float> sent(count, static_cast<float>(rank));
      shm.broadcast(sent.data(), count * sizeof(float), round % world);  // in step, by pieces
      for (std::size_t i = 0; i < count; i += 997) {
        ASSERT_EQ(sent[i], static_cast<float>(round % world)) << "broadcast, element " << i;
      }
      std::vector<float> few(5000, static_cast<float>(rank));  // a stream, between the steps
      shm.broadcast(few.data(), few.size() * sizeof(float), (round + 1) % world);
      ASSERT_EQ(few.front(), static_cast<float>((round + 1) % world));
      ASSERT_EQ(few.back(), static_cast<float>((round + 1) % world));
      shm.barrier();
    }
  });
}

// The broadcast streams through a ring of pieces, and its root leaves without waiting for the
// others to read; a rank leaves once every rank has entered (Note [The broadcast as a
// stream]). Rank 2 enters the first and the third broadcast late. Ranks 0 and 1 must not run
// on into later calls meanwhile (what they publish of those would stand where rank 2 checks
// the first); the second's root, rank 1, must take rank 0, the first's root, for having read
// the first; the third, from rank 0 and longer than the ring, must wait for rank 2 before it
// writes a piece over one not yet read. Rank 2 enters the fourth a millisecond late, once it
// is all written: a little shorter than the ring, it starts where the third ended and wraps to
// the ring's start. The fifth, one piece from rank 1, goes at the ring's start, and must wait
// until rank 2, reading the fourth in order, has read what stands there. The buffers are
// filled before and checked after all the calls, and rank 2 has a CPU to itself where there
// are two, so that nothing holds ranks 0 and 1 up while it reads; the waits are bounded at 5 s.
TEST(Shm, StreamedBroadcastsWaitForEveryRankToEnter) {
  const int world = 3;
  RanksInThisProcess ranks(world,
                           [](int, ShmOptions& options) { options.timeout = milliseconds(5000); });
  const std::size_t small = 100 * 1000 + 3, large = kShmStreamBytes + kShmStreamBytes / 2 + 5;
  const int roots[] = {0, 1, 0, 0, 1};
  const std::size_t sizes[] = {small, small, large, kShmStreamBytes - small, 5000};
  const milliseconds late[] = {milliseconds(200), milliseconds(0), milliseconds(200),
                               milliseconds(1), milliseconds(0)};
  // Not periodic in the ring's length, so that a piece written over another shows.
  auto value = [](int call, std::size_t i) {
    return static_cast<std::uint8_t>(call * 101 + i * 7 + i / 251);
  };
  const std::vector<int> cpus = cpus_of(cpu_affinity());  // empty where not known
  testing::run_ranks(world, [&](int rank) {
    if (cpus.size() >= 2) hold_this_thread_to(cpus[rank == 2 ? 0 : 1]);
    ShmCollectives& shm = ranks[rank];
    std::vector<std::vector<std::uint8_t>> data;
    for (int call = 0; call < 5; ++call) {
      data.emplace_back(sizes[call], 0xee);
      if (rank == roots[call]) {
        for (std::size_t i = 0; i < sizes[call]; ++i) data[call][i] = value(call, i);
      }
    }
    for (int call = 0; call < 5; ++call) {
      if (rank == 2) std::this_thread::sleep_for(late[call]);
      shm.broadcast(data[call].data(), sizes[call], roots[call]);
    }
    for (int call = 0; call < 5; ++call) {
      for (std::size_t i = 0; i < sizes[call]; ++i) {
        ASSERT_EQ(data[call][i], value(call, i))
            << "rank " << rank << ", call " << call << ", byte " << i;
      }
    }
  });
}

// An allgather of blocks from 128 KiB reads each other rank's block straight from its process
// where every rank can (here the ranks are threads of one process, which may always read its
// own memory), in place and not, and returns only once the others have read this rank's
// input; every rank agrees on the path: with one rank that declines (ShmOptions::single_copy),
// all go through the slots, with the same results.
TEST(Shm, LargeAllgatherReadsTheOthersBlocksOnlyWhereEveryRankCan) {
  for (const int world : {2, 3}) {
    for (const int declining : {-1, world - 1}) {
      RanksInThisProcess ranks(
          world, [&](int r, ShmOptions& options) { options.single_copy = r != declining; });
      const std::size_t n = (std::size_t{1} << 20) / 8 + 5;  // a block of about 1 MiB of i64
      auto value = [](int r, std::size_t i) { return std::int64_t{r} * 1000003 + 7 * i; };
      // One byte a rank, not std::vector<bool>: the ranks are threads, and bits of one word
      // written by two of them at once lose one of the writes.
      std::vector<char> small_single(world), large_single(world);
      testing::run_ranks(world, [&](int rank) {
        ShmCollectives& shm = ranks[rank];
        std::vector<std::int64_t> mine(n), all(n * world, -1), in_place(n * world, -1);
        for (std::size_t i = 0; i < n; ++i) mine[i] = in_place[rank * n + i] = value(rank, i);
        shm.allgather(mine.data(), all.data(), 1000 * 8);  // below 128 KiB: the slots
        small_single[rank] = shm.last_was_single_copy();
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(all[r * 1000 + 999], value(r, 999)) << "rank " << rank << " block " << r;
        }
        shm.allgather(mine.data(), all.data(), n * 8);
        large_single[rank] = shm.last_was_single_copy();
        // Every rank has read this one's block by the time the call returns.
        std::fill(mine.begin(), mine.end(), -2);
        shm.allgather(in_place.data() + rank * n, in_place.data(), n * 8);
        for (int r = 0; r < world; ++r) {
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(all[r * n + i], value(r, i)) << "rank " << rank << " block " << r << " " << i;
          }
        }
        EXPECT_TRUE(in_place == all) << "rank " << rank;
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_FALSE(small_single[r]) << "world " << world << " rank " << r;
#if defined(__linux__)
        EXPECT_EQ(large_single[r] != 0, declining < 0 && testing::may_read_own_memory())
            << "world " << world << " rank " << r;
#else
        EXPECT_FALSE(large_single[r]);
#endif
      }
    }
  }
}

#if defined(__linux__)
// A single-copy allgather returns only once every rank has read this rank's input: rank 0,
// reading into memory it has touched, overwrites its input as soon as its call returns, while
// rank 1 reads into fresh pages, each a fault on the way, and so is still reading when it
// would have returned without the last sync.
TEST(Shm, SingleCopyAllgatherReturnsOnlyOnceTheOthersHaveRead) {
  if (!testing::may_read_own_memory()) GTEST_SKIP() << "process_vm_readv is refused here";
  const int world = 2;
  RanksInThisProcess ranks(world, [](int, ShmOptions&) {});
  const std::size_t n = (std::size_t{32} << 20) / 8;  // 32 MiB blocks of i64
  std::vector<std::int64_t> first(n, 5), first_out(n * world, 1);
  for (int round = 0; round < 3; ++round) {
    std::size_t wrong = 0;
    const std::size_t out_bytes = n * world * 8;
    void* fresh =
        mmap(nullptr, out_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(fresh, MAP_FAILED);
    std::fill(first.begin(), first.end(), 5);
    testing::run_ranks(world, [&](int rank) {
      if (rank == 0) {
        ranks[0].allgather(first.data(), first_out.data(), n * 8);
        std::fill(first.begin(), first.end(), -2);
      } else {
        std::vector<std::int64_t> second(n, 6);
        auto* out = static_cast<std::int64_t*>(fresh);
        ranks[1].allgather(second.data(), out, n * 8);
        wrong = static_cast<std::size_t>(
            std::count_if(out, out + n, [](std::int64_t v) { return v != 5; }));
      }
    });
    munmap(fresh, out_bytes);
    EXPECT_TRUE(ranks[0].last_was_single_copy());
    EXPECT_EQ(wrong, 0u) << "round " << round << ": rank 1 read rank 0's input after it changed";
  }
}

// Sets or clears CAP_SYS_PTRACE in this process's effective capabilities (from its permitted
// ones), so that a test can see what a process without the privilege sees.
void set_ptrace_capability(bool on) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return;
  const unsigned bit = 1u << (CAP_SYS_PTRACE % 32);
  auto& word = data[CAP_SYS_PTRACE / 32];
  word.effective = on ? word.effective | (word.permitted & bit) : word.effective & ~bit;
  syscall(SYS_capset, &header, data);
}

// Rank 0 (this process) and rank 1 (a child) over one region made before the fork; `child`
// runs rank 1 and returns its exit status, `parent` runs rank 0 with the child's pid.
template <typename Child, typename Parent>
void two_rank_processes(std::size_t region_bytes, Child&& child, Parent&& parent) {
  void* region =
      mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  ShmOptions options;
  options.timeout = milliseconds(20000);
  ShmCollectives first(region, 0, 2, options);  // lays out the region before the fork
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int status = 99;
    try {
      ShmCollectives second(region, 1, 2, options);
      status = child(second);
    } catch (...) {
    }
    _exit(status);
  }
  parent(first, pid);
  munmap(region, region_bytes);
}

// What ended `calls`: the rank a PeerError blamed (-1 for none or another error) and the message.
struct Failure {
  int blamed = -1;
  std::string error;
};
template <typename Calls>
Failure failure_of(Calls&& calls) {
  Failure failure;
  try {
    calls();
  } catch (const PeerError& e) {
    failure = {e.peer_rank(), e.what()};
  } catch (const std::exception& e) {
    failure.error = e.what();
  }
  return failure;
}

// A rank that comes after a peer gave up waiting for it names that peer, which is leaving, and
// not itself (the peer's mark blames it).
TEST(Shm, ARankLateForAPeerThatGaveUpNamesThePeer) {
  const int world = 2;
  testing::ScratchDir dir;
  std::vector<Failure> failures(world);
  testing::run_ranks(world, [&](int rank) {
    CommOptions options;
    options.backend = "shm";
    options.timeout = milliseconds(300);
    const RankComm r = connect(dir, rank, world, options);
    if (rank == 1) std::this_thread::sleep_for(milliseconds(1000));
    float value = 1;
    failures[rank] = failure_of([&] { r.comm->allreduce({&value, 1, DType::f32}, ReduceOp::sum); });
  });
  EXPECT_EQ(failures[0].blamed, 1) << failures[0].error;
  EXPECT_NE(failures[0].error.find("shm: rank 1 did not arrive within 300 ms"), std::string::npos)
      << failures[0].error;
  EXPECT_EQ(failures[1].blamed, 0) << failures[1].error;
  EXPECT_NE(failures[1].error.find("shm: rank 0 gave up on this rank during allreduce"),
            std::string::npos)
      << failures[1].error;
}

// A rank process killed while the two read each other's blocks: the survivor ends with an
// error naming it, instead of hanging or reading freed memory. (A read under way holds the
// dead process's memory until it ends; the wait that follows finds the rank gone. A read that
// starts after the death fails, and the sync after it names the rank too.)
TEST(Shm, RankKilledDuringSingleCopyAllgathersIsNamed) {
  if (!testing::siblings_may_read_each_other()) GTEST_SKIP() << "ranks may not read each other";
  const std::size_t bytes = std::size_t{8} << 20;
  two_rank_processes(
      shm_region_bytes(2),
      [&](ShmCollectives& second) {
        std::vector<std::uint8_t> in(bytes, 1), out(bytes * 2);
        for (int i = 0; i < 100000; ++i) second.allgather(in.data(), out.data(), bytes);
        return 0;
      },
      [&](ShmCollectives& first, pid_t child) {
        std::atomic<bool> started{false};
        std::thread killer([&] {  // once a single-copy call has run, and at most 20 s on
          for (int i = 0; i < 2000 && !started.load(); ++i)
            std::this_thread::sleep_for(milliseconds(10));
          std::this_thread::sleep_for(milliseconds(100));
          kill(child, SIGKILL);
        });
        std::vector<std::uint8_t> in(bytes, 0), out(bytes * 2);
        const Failure failure = failure_of([&] {
          for (int i = 0; i < 100000; ++i) {  // about 1 ms each: the kill comes long before
            first.allgather(in.data(), out.data(), bytes);
            if (first.last_was_single_copy()) started = true;
          }
        });
        killer.join();
        waitpid(child, nullptr, 0);
        EXPECT_TRUE(started.load());
        EXPECT_EQ(failure.blamed, 1) << failure.error;
        EXPECT_NE(failure.error.find("rank 1"), std::string::npos) << failure.error;
      });
}

// A rank process killed while broadcasts stream through the region, as the root and as the
// rank that reads: the survivor ends with an error naming it. Each broadcast is longer than
// the stream's ring, so that a root waits on the reader within the call too.
TEST(Shm, RankKilledDuringStreamedBroadcastsIsNamed) {
  const std::size_t bytes = std::size_t{8} << 20;
  for (const int root : {0, 1}) {
    two_rank_processes(
        shm_region_bytes(2),
        [&](ShmCollectives& second) {
          std::vector<std::uint8_t> data(bytes, 1);
          for (int i = 0; i < 100000; ++i) second.broadcast(data.data(), bytes, root);
          return 0;
        },
        [&](ShmCollectives& first, pid_t child) {
          std::thread killer([&] {
            std::this_thread::sleep_for(milliseconds(200));
            kill(child, SIGKILL);
          });
          std::vector<std::uint8_t> data(bytes, 0);
          const Failure failure = failure_of([&] {
            for (int i = 0; i < 100000; ++i) {  // about 0.5 ms each: the kill comes long before
              first.broadcast(data.data(), bytes, root);
            }
          });
          killer.join();
          waitpid(child, nullptr, 0);
          EXPECT_EQ(failure.blamed, 1) << "root " << root << ": " << failure.error;
          EXPECT_NE(failure.error.find("rank 1"), std::string::npos) << failure.error;
        });
  }
}

// A read the kernel refuses after the ranks agreed (rank 1 makes itself undumpable after the
// first call, and rank 0 drops CAP_SYS_PTRACE) is told to every rank, which all run that call
// again through the slots, with the right results; and they keep to the slots (the third call
// would be read in one copy again, rank 1 being dumpable again by then).
TEST(Shm, ASingleCopyReadThatFailsRunsTheCallAgainThroughTheSlots) {
  if (!testing::siblings_may_read_each_other()) GTEST_SKIP() << "ranks may not read each other";
  const std::size_t n = (std::size_t{1} << 20) / 8;  // 1 MiB blocks of i64
  // Rank r's block in call c, and whether `out` holds both ranks' blocks of call c.
  auto value = [](int r, int c, std::size_t i) {
    return std::int64_t{r} * 1000003 + c * 7 + static_cast<std::int64_t>(i);
  };
  auto right = [&](const std::vector<std::int64_t>& out, int c) {
    for (int r = 0; r < 2; ++r) {
      for (std::size_t i = 0; i < n; i += 101) {
        if (out[r * n + i] != value(r, c, i)) return false;
      }
    }
    return true;
  };
  // Per call, as the bits of an exit status: 1 wrong results, 2 the path not as expected.
  auto run = [&](ShmCollectives& shm, int rank, const std::function<void(int)>& between) {
    int status = 0;
    std::vector<std::int64_t> in(n), out(2 * n);
    for (int c = 0; c < 3; ++c) {
      for (std::size_t i = 0; i < n; ++i) in[i] = value(rank, c, i);
      shm.allgather(in.data(), out.data(), n * 8);
      if (!right(out, c)) status |= 1 << (2 * c);
      if (shm.last_was_single_copy() != (c == 0)) status |= 2 << (2 * c);
      between(c);
    }
    return status;
  };
  two_rank_processes(
      shm_region_bytes(2),
      [&](ShmCollectives& second) {
        return run(second, 1, [](int c) { prctl(PR_SET_DUMPABLE, c == 0 ? 0 : 1); });
      },
      [&](ShmCollectives& first, pid_t child) {
        struct Restore {
          ~Restore() { set_ptrace_capability(true); }
        } restore;
        int mine = -1;
        std::string error;
        try {
          mine = run(first, 0, [](int c) {
            if (c == 0) set_ptrace_capability(false);
          });
        } catch (const std::exception& e) {
          error = e.what();
        }
        int status = 0;
        waitpid(child, &status, 0);  // within the timeout, should rank 0 have stopped early
        EXPECT_EQ(mine, 0) << error
                           << " (rank 0: bits 1, 4, 16 wrong results in calls 0-2; 2, 8, 32 the "
                              "path)";
        EXPECT_TRUE(WIFEXITED(status)) << status;
        EXPECT_EQ(WEXITSTATUS(status), 0) << "rank 1, as rank 0's bits";
      });
}
#endif

TEST(Shm, LeavesNothingInDevShm) {
  namespace fs = std::filesystem;
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  // Regions are named partrain-shm-<hash of the run token>-...: count this run's only.
  const std::string token = "shm-leak-test-" + std::to_string(::getpid());
  std::ostringstream stem;
  stem << "partrain-shm-" << std::hex << fnv1a_64(token) << "-";
  auto ours = [&] {
    int n = 0;
    for (const auto& entry : fs::directory_iterator("/dev/shm")) {
      n += entry.path().filename().string().rfind(stem.str(), 0) == 0;
    }
    return n;
  };
  allreduce_with("shm", 3, DType::f32, ReduceOp::sum, DType::f32, 100, "auto", token);
  EXPECT_EQ(ours(), 0);
}

}  // namespace
}  // namespace partrain::comm
