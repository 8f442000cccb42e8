// trace_failed_rank() over an in-memory store: which rank the chain of blame names, and what
// it keeps when the store goes away in the middle of the trace (the store lives in rank 0,
// which may be stopping because of the same failure).
#include "comm_backends/backends/failure_trace.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "comm_backends/store/store.h"
#include "common/errors.h"

namespace partrain_test {
namespace {

using partrain::comm::FailureTrace;
using partrain::comm::trace_failed_rank;
using namespace std::chrono_literals;

// A map; after `requests_left` requests every request throws, as a TcpStore does once its
// server has gone.
class MapStore : public partrain::comm::Store {
 public:
  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    use();
    values_[key] = value;
  }
  std::vector<std::uint8_t> get(const std::string& key) override {
    use();
    auto it = values_.find(key);
    if (it == values_.end()) throw partrain::CommError("no key " + key);
    return it->second;
  }
  std::int64_t add(const std::string&, std::int64_t) override { throw partrain::CommError("add"); }
  void wait(const std::vector<std::string>&, std::chrono::milliseconds) override {
    throw partrain::CommError("wait");
  }
  bool check(const std::vector<std::string>& keys) override {
    use();
    for (const auto& key : keys) {
      if (!values_.count(key)) return false;
    }
    return true;
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  void said_why_it_stopped(int rank) { values_[partrain::comm::rank_stopped_key(rank)] = {'x'}; }
  void report(int rank, int blames) {
    const std::string text = std::to_string(blames);
    values_["t/failed/" + std::to_string(rank)] = {text.begin(), text.end()};
  }
  int requests_left = 1 << 30;

 private:
  void use() {
    if (requests_left-- <= 0) throw partrain::CommError("tcp store: connection lost");
  }
  std::map<std::string, std::vector<std::uint8_t>> values_;
  std::chrono::milliseconds timeout_{5000};
};

FailureTrace trace(MapStore& store, int rank, int size, int blamed) {
  return trace_failed_rank(store, "t/", rank, size, blamed, 50ms, 100ms);
}

TEST(FailureTrace, FollowsTheChainToTheRankThatSentNoReport) {
  MapStore store;
  store.report(2, 3);  // rank 2 blames rank 3, which died and sent nothing
  EXPECT_EQ(trace(store, 1, 4, 2).culprit, 3);
  EXPECT_EQ(store.timeout(), 5000ms);  // the store's own bound is given back
}

TEST(FailureTrace, KeepsTheFurthestRankReachedWhenTheStoreGoesAway) {
  MapStore store;
  store.report(2, 3);
  // set (its own report), check(2) twice, get(2): then the store's host is gone.
  store.requests_left = 4;
  const FailureTrace found = trace(store, 1, 4, 2);
  EXPECT_EQ(found.culprit, 3);
  // Which ranks it heard from, and that the store went: the rank serving it, had it been
  // rank 2, was a survivor that left since (CheckedCommunicator::trace_and_rethrow()).
  EXPECT_TRUE(found.store_lost);
  EXPECT_EQ(found.heard, std::vector<int>{2});
}

TEST(FailureTrace, KeepsTheBlamedRankWhenTheStoreIsGoneAtOnce) {
  MapStore store;
  store.report(2, 3);
  store.requests_left = 0;
  const FailureTrace found = trace(store, 1, 4, 2);
  EXPECT_EQ(found.culprit, 2);
  EXPECT_TRUE(found.store_lost);
  EXPECT_TRUE(found.heard.empty());
}

TEST(FailureTrace, ACircleKeepsTheLastRankNamedNotTheTracingRank) {
  MapStore store;
  store.report(2, 3);
  store.report(3, 1);  // 2 -> 3 -> 1, the tracing rank itself
  EXPECT_EQ(trace(store, 1, 4, 2).culprit, 3);
}

TEST(FailureTrace, AChainThatCannotTellEndsAtTheSilentRank) {
  MapStore store;
  store.report(2, -1);  // rank 2 could not tell whom it lost
  store.report(0, -1);
  const FailureTrace found = trace(store, 1, 4, 2);
  EXPECT_EQ(found.culprit, 3);
  EXPECT_EQ(found.silent, std::vector<int>{3});
  EXPECT_EQ(found.heard, (std::vector<int>{2, 0}));
  EXPECT_FALSE(found.store_lost);
}

// A rank that said why it stopped sends no report: the trace names it without waiting out the
// grace period (here 10 s) for one, at the end of a chain and as the one silent rank alike.
TEST(FailureTrace, ARankThatSaidWhyItStoppedIsNamedWithoutTheGracePeriod) {
  for (const int blamed : {2, -1}) {
    MapStore store;
    store.report(2, 3);
    store.report(0, 3);
    store.said_why_it_stopped(3);
    const auto start = std::chrono::steady_clock::now();
    const FailureTrace found = trace_failed_rank(store, "t/", 1, 4, blamed, 10s, 20s);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << blamed;
    EXPECT_EQ(found.culprit, 3) << blamed;
  }
}

}  // namespace
}  // namespace partrain_test
