#include "comm_backends/store/file_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;
using testing::ScratchDir;

std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

StoreOptions quick(const std::string& token = "t") {
  StoreOptions options;
  options.token = token;
  options.timeout = milliseconds(2000);
  return options;
}

TEST(StoreUrl, FileUrlsIncludingWindowsPaths) {
  EXPECT_EQ(parse_store_url("file:///tmp/rdzv").path, "/tmp/rdzv");
  EXPECT_EQ(parse_store_url("file:///C:/tmp/rdzv").path, "C:/tmp/rdzv");
  EXPECT_EQ(parse_store_url("file://C:/tmp/rdzv").path, "C:/tmp/rdzv");
  EXPECT_EQ(parse_store_url("file:///d:\\share\\x").path, "d:\\share\\x");
  EXPECT_EQ(parse_store_url("file://localhost/tmp/x").path, "/tmp/x");
  EXPECT_EQ(parse_store_url("file:///tmp/a%20b").path, "/tmp/a b");
  EXPECT_EQ(parse_store_url("file://relative/dir").path, "relative/dir");
  EXPECT_EQ(parse_store_url("file:///Cx/y").path, "/Cx/y");  // not a drive letter
  EXPECT_THROW(parse_store_url("file://"), UsageError);
  EXPECT_THROW(parse_store_url("file:///tmp/%zz"), UsageError);
}

TEST(StoreUrl, TcpAndEnvUrls) {
  auto tcp = parse_store_url("tcp://127.0.0.1:29500");
  EXPECT_EQ(tcp.kind, StoreUrl::Kind::tcp);
  EXPECT_EQ(tcp.host, "127.0.0.1");
  EXPECT_EQ(tcp.port, 29500);
  auto v6 = parse_store_url("tcp://[::1]:80");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 80);
  EXPECT_THROW(parse_store_url("tcp://127.0.0.1"), UsageError);
  EXPECT_THROW(parse_store_url("tcp://127.0.0.1:70000"), UsageError);
  EXPECT_THROW(parse_store_url("tcp://127.0.0.1:12a"), UsageError);
  EXPECT_THROW(parse_store_url("redis://x:1"), UsageError);
  EXPECT_THROW(parse_store_url("/tmp/x"), UsageError);

  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  auto env = parse_store_url("env://");
  EXPECT_EQ(env.kind, StoreUrl::Kind::tcp);
  EXPECT_EQ(env.host, "127.0.0.1");
  EXPECT_EQ(env.port, 29511);
  ::unsetenv("MASTER_PORT");
  EXPECT_THROW(parse_store_url("env://"), UsageError);
  ::unsetenv("MASTER_ADDR");
}

TEST(FileStore, SetGetAddCheckWait) {
  ScratchDir dir;
  auto store = open_store(dir.url(), quick());
  store->set("a/b:c", {0, 1, 2, 255});
  EXPECT_EQ(store->get("a/b:c"), (std::vector<std::uint8_t>{0, 1, 2, 255}));
  store->set("a/b:c", bytes("replaced"));
  EXPECT_EQ(store->get("a/b:c"), bytes("replaced"));
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_TRUE(store->check({"a/b:c", "n"}));
  EXPECT_FALSE(store->check({"a/b:c", "missing"}));
  store->set("empty", {});
  EXPECT_TRUE(store->get("empty").empty());
}

TEST(FileStore, GetWaitsForALaterSetAndTimesOutNamingTheKey) {
  ScratchDir dir;
  auto store = open_store(dir.url(), quick());
  std::thread writer([&] {
    auto other = open_store(dir.url(), quick());
    std::this_thread::sleep_for(milliseconds(50));
    other->set("late", bytes("here"));
  });
  EXPECT_EQ(store->get("late"), bytes("here"));
  writer.join();

  StoreOptions short_wait = quick();
  short_wait.timeout = milliseconds(100);
  auto impatient = open_store(dir.url(), short_wait);
  const auto start = std::chrono::steady_clock::now();
  try {
    impatient->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
  EXPECT_THROW(store->wait({"late", "nope"}, milliseconds(50)), CommError);
}

TEST(FileStore, ConcurrentAddsAreAtomic) {
  ScratchDir dir;
  constexpr int kThreads = 6, kAdds = 40;
  testing::run_ranks(kThreads, [&](int) {
    auto store = open_store(dir.url(), quick());
    for (int i = 0; i < kAdds; ++i) store->add("counter", 1);
  });
  auto store = open_store(dir.url(), quick());
  EXPECT_EQ(store->add("counter", 0), kThreads * kAdds);
}

TEST(FileStore, ReaderNeverSeesAPartialValue) {
  ScratchDir dir;
  auto store = open_store(dir.url(), quick());
  store->set("big", std::vector<std::uint8_t>(1 << 20, 0));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    auto other = open_store(dir.url(), quick());
    for (std::uint8_t round = 1; !stop; ++round) {
      other->set("big", std::vector<std::uint8_t>(1 << 20, round));
    }
  });
  for (int i = 0; i < 60; ++i) {
    const auto value = store->get("big");
    ASSERT_EQ(value.size(), 1u << 20);
    for (std::size_t j = 1; j < value.size(); j += 4093) ASSERT_EQ(value[j], value[0]);
    ASSERT_EQ(value.back(), value[0]);
  }
  stop = true;
  writer.join();
  // No temp files or locks are left behind.
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (entry.is_regular_file()) {
      ++files;
      EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos);
    }
  }
  EXPECT_EQ(files, 1);
}

TEST(FileStore, RunTokensKeepRunsApart) {
  ScratchDir dir;
  auto first = open_store(dir.url(), quick("run-1"));
  auto second = open_store(dir.url(), quick("run-2"));
  first->set("k", bytes("one"));
  EXPECT_FALSE(second->check({"k"}));
  second->set("k", bytes("two"));
  EXPECT_EQ(first->get("k"), bytes("one"));
  EXPECT_EQ(open_store(dir.url(), quick("run-2"))->get("k"), bytes("two"));
}

// A run killed mid-way leaves its counters, addresses and add() lock folders behind. The
// next run on the same directory, with or without the same token, starts from none of it:
// its counters start at zero, no lock blocks it, and a ring forms at the new addresses.
void expect_reuse_starts_clean(const std::string& token) {
  ScratchDir dir;
  constexpr int kWorld = 3;
  StoreOptions options = quick(token);
  options.world_size = kWorld;
  testing::run_ranks(kWorld, [&](int rank) {
    StoreOptions mine = options;
    mine.rank = rank;
    auto store = open_store(dir.url(), mine);
    EXPECT_EQ(store->add("comm/instances/" + std::to_string(rank), 1), 1);
    store->add("shared", 5);
  });
  // What a killed process leaves: a lock folder of add(), in the session and beside it.
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (entry.is_directory() && entry.path().filename().string().rfind("session-", 0) == 0) {
      std::filesystem::create_directory(entry.path() / "k_shared.lock");
      std::filesystem::create_directory(entry.path() / "k_comm%2finstances%2f0.lock");
    }
  }
  std::filesystem::create_directory(dir.path() / "k_shared.lock");
  std::atomic<int> ok{0};
  testing::run_ranks(kWorld, [&](int rank) {
    StoreOptions mine = options;
    mine.rank = rank;
    auto store = open_store(dir.url(), mine);
    EXPECT_EQ(store->add("comm/instances/" + std::to_string(rank), 1), 1) << "stale counter";
    store->add("shared", 1);
    store->set("done/" + std::to_string(rank), bytes("yes"));
    store->wait({"done/0", "done/1", "done/2"}, milliseconds(2000));
    EXPECT_EQ(store->add("shared", 0), kWorld) << "stale value under a key";
    ++ok;
  });
  EXPECT_EQ(ok.load(), kWorld);
  // Only this run's session is left.
  int sessions = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    sessions += entry.is_directory() && entry.path().filename().string().rfind("session-", 0) == 0;
  }
  EXPECT_EQ(sessions, 1);
}

TEST(FileStore, ReusedDirectoryWithTheSameTokenStartsClean) { expect_reuse_starts_clean("job"); }
TEST(FileStore, ReusedDirectoryWithoutATokenStartsClean) { expect_reuse_starts_clean(""); }

TEST(FileStore, RankWithoutItsRunIsNamed) {
  ScratchDir dir;
  StoreOptions options = quick("job");
  options.world_size = 3;
  options.timeout = milliseconds(300);
  try {
    FileStore store(dir.path(), options);  // rank 0; ranks 1 and 2 never come
    FAIL() << "rank 0 opened a session without its ranks";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 1, 2 did not join"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace partrain::comm
