// A Gloo rank that goes on an error of its own, after collectives ran, is found at once by the
// rank left behind, whatever it calls next (Note [A peer gone before the algorithm was built]
// in gloo_backend.cpp).
#ifdef PARTRAIN_WITH_GLOO

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/backends/failure_trace.h"
#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

struct NextCall {
  const char* name;
  std::function<void(Communicator&)> call;
};

const std::string kWhy = "rank 1 (h) stopped: its disk is full";

// Two gloo ranks as threads run an allreduce together; then rank 1 goes, its communicator
// destroyed while it unwinds from an error of its own, having said why in the store (as a
// worker does, RankGroup::tell_stopped()), as rank 0 calls `next`. That call must fail naming
// rank 1, and why it stopped, within 5 s of rank 1's error; the timeout is 20 s. Rank 0 may
// build its next algorithm before rank 1's sockets close or after: both must end at once.
void expect_next_call_fails_at_once(const NextCall& next) {
  SCOPED_TRACE(next.name);
  constexpr int kWorld = 2;
  testing::ScratchDir dir;
  StoreOptions store_options;
  std::unique_ptr<Store> stores[kWorld] = {open_store(dir.url(), store_options),
                                           open_store(dir.url(), store_options)};
  CommOptions options;
  options.backend = "gloo";
  options.timeout = milliseconds(20000);
  std::atomic<bool> failed{false};
  std::atomic<bool> first_done{false};
  std::chrono::steady_clock::time_point failed_at;
  testing::run_ranks(kWorld, [&](int rank) {
    auto comm = make_communicator(options, *stores[rank], rank, kWorld);
    std::vector<float> data(100, 1.0f);
    comm->allreduce(Buffer{data.data(), data.size(), DType::f32}, ReduceOp::sum);
    if (rank == 0) first_done = true;
    if (rank == 1) {
      // Rank 0 may still be reading the last of the allreduce that rank 1 has finished: rank 1
      // goes once rank 0 has it too (bounded, 10 s), or its going fails that allreduce instead
      // of the next call.
      for (int i = 0; i < 1000 && !first_done; ++i) std::this_thread::sleep_for(milliseconds(10));
      try {
        const auto going = std::move(comm);
        failed_at = std::chrono::steady_clock::now();
        stores[rank]->set(rank_stopped_key(rank),
                          std::vector<std::uint8_t>(kWhy.begin(), kWhy.end()));
        failed = true;
        throw Error("its disk is full");
      } catch (const Error&) {
      }
      return;
    }
    for (int i = 0; i < 1000 && !failed; ++i) std::this_thread::sleep_for(milliseconds(10));
    ASSERT_TRUE(failed);
    std::string error;
    try {
      next.call(*comm);
      ADD_FAILURE() << "the call with a rank that left returned";
    } catch (const PeerError& e) {
      error = e.what();
      EXPECT_EQ(e.peer_rank(), 1) << error;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - failed_at, std::chrono::seconds(5)) << error;
    EXPECT_NE(error.find("; " + kWhy), std::string::npos) << error;
    EXPECT_EQ(error.find(kItsOwnOutputSaysWhy), std::string::npos) << error;
  });
}

Buffer floats(std::vector<float>& data) { return Buffer{data.data(), data.size(), DType::f32}; }

TEST(GlooGone, ARankGoneOnItsOwnErrorIsFoundAtOnceByEveryNextCall) {
  std::vector<float> in;
  std::vector<float> out;
  const std::vector<NextCall> calls = {
      {"barrier", [&](Communicator& c) { c.barrier(); }},
      {"broadcast",
       [&](Communicator& c) {
         in.assign(1000, 1.0f);
         c.broadcast(floats(in), 1);
       }},
      {"allgather kept",
       [&](Communicator& c) {
         in.assign(1024, 1.0f);
         out.assign(2048, 0.0f);
         c.allgather(floats(in), floats(out));
       }},
      {"allgather built per call",
       [&](Communicator& c) {
         in.assign(std::size_t{1} << 18, 1.0f);  // 1 MiB a rank, 2 MiB gathered
         out.assign(std::size_t{1} << 19, 0.0f);
         c.allgather(floats(in), floats(out));
       }},
      {"allreduce of another size",
       [&](Communicator& c) {
         in.assign(200, 1.0f);
         c.allreduce(floats(in), ReduceOp::sum);
       }},
      {"allreduce kept",
       [&](Communicator& c) {
         in.assign(100, 1.0f);
         c.allreduce(floats(in), ReduceOp::sum);
       }},
  };
  for (const auto& next : calls) expect_next_call_fails_at_once(next);
}

}  // namespace
}  // namespace partrain::comm

#endif  // PARTRAIN_WITH_GLOO
