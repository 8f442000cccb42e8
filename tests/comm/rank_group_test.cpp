// open_rank_group(): the store, the hosts learned once, and communicators over them, as
// `partrain worker` and `partrain bench` open their ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/rank_group.h"
#include "comm_backends/store/memory_store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

// The system temp directory is a folder of the test's own while this lives (TMPDIR; TMP on
// Windows), so that whatever is made there can be seen and nothing else adds to it.
class OwnTempDirectory {
 public:
  OwnTempDirectory() { point_at(dir_.string()); }
  ~OwnTempDirectory() { point_at(saved_); }
  OwnTempDirectory(const OwnTempDirectory&) = delete;
  OwnTempDirectory& operator=(const OwnTempDirectory&) = delete;
  const std::filesystem::path& path() const { return dir_.path(); }
  std::size_t entries() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
      ++n;
    }
    return n;
  }

 private:
#ifdef _WIN32
  static constexpr const char* kName = "TMP";
  // The C runtime's copy of the environment and the system's, which GetTempPath reads.
  static void point_at(const std::string& path) { ::_putenv_s(kName, path.c_str()); }
#else
  static constexpr const char* kName = "TMPDIR";
  static void point_at(const std::string& path) {
    if (path.empty()) {
      ::unsetenv(kName);
    } else {
      ::setenv(kName, path.c_str(), 1);
    }
  }
#endif
  testing::ScratchDir dir_;
  std::string saved_ = std::getenv(kName) != nullptr ? std::getenv(kName) : "";
};

// A lone rank has nobody to meet: its store is in memory, so it writes nothing on disk (and a
// rank that ends abruptly leaves nothing behind), and communicators of every backend that
// takes one rank run over it.
TEST(RankGroup, OneRankWithoutARendezvousKeepsItsStoreInMemory) {
  const OwnTempDirectory temp;
  // The same folder, whether or not the system writes a separator after it.
  ASSERT_EQ((std::filesystem::temp_directory_path() / "x").parent_path(),
            (temp.path() / "x").parent_path());
  RankGroupOptions options;
  options.timeout = milliseconds(10000);
  auto group = open_rank_group(options);
  EXPECT_EQ(temp.entries(), 0u);
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
#ifdef PARTRAIN_WITH_GLOO
  comm_options.backend = "gloo";
  auto gloo = group->make_communicator(comm_options);
  gloo->allreduce(Buffer{&x, 1, DType::f64}, ReduceOp::sum);
  EXPECT_EQ(x, 2.5);
#endif
  EXPECT_EQ(temp.entries(), 0u);
}

// The store of a lone rank, which the threads of its process share: set, get, add, check and
// wait as the other stores do, a get or wait bounded by the timeout and naming what is missing.
TEST(MemoryStore, KeepsKeysForTheThreadsOfOneProcess) {
  StoreOptions options;
  options.timeout = milliseconds(100);
  options.join_key = "joined/0";
  options.join_value = {1};
  MemoryStore store(options);
  EXPECT_TRUE(store.check({"joined/0"}));
  store.set("a", {0, 255});
  EXPECT_EQ(store.get("a"), (std::vector<std::uint8_t>{0, 255}));
  store.set("empty", {});
  EXPECT_TRUE(store.get("empty").empty());
  EXPECT_THROW(store.add("empty", 1), CommError);  // not an integer
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -2), 3);
  EXPECT_FALSE(store.check({"a", "missing"}));
  try {
    store.wait({"a", "missing", "gone"}, milliseconds(50));
    FAIL() << "a wait for missing keys returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("missing, gone"), std::string::npos) << e.what();
  }
  try {
    store.get("never");
    FAIL() << "a get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("'never' was not set within 100 ms"), std::string::npos)
        << e.what();
  }
  // Another thread's set ends a wait at once.
  store.set_timeout(milliseconds(10000));
  const auto start = std::chrono::steady_clock::now();
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store.set("late", {9});
  });
  EXPECT_EQ(store.get("late"), std::vector<std::uint8_t>{9});
  writer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
  constexpr int kThreads = 4, kAdds = 100;
  testing::run_ranks(kThreads, [&](int) {
    for (int i = 0; i < kAdds; ++i) store.add("counter", 1);
  });
  EXPECT_EQ(store.add("counter", 0), kThreads * kAdds);
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
