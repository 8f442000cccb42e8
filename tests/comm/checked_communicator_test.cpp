// CheckedCommunicator, the wrapper around every backend: each collective numbered as the
// backend numbers it and kept in the flight recorder (with the algorithm it took), buffers
// checked against the backend's capabilities, and a failed communicator refused after.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "comm_backends/checked_communicator.h"
#include "comm_backends/communicator.h"
#include "comm_backends/flight_recorder.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::comm {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<Communicator> make(const testing::ScratchDir& dir, Store*& store_out,
                                   std::unique_ptr<Store>& store, int rank, int world,
                                   const std::string& backend) {
  StoreOptions so;
  so.timeout = milliseconds(10000);
  store = open_store(dir.url(), so);
  store_out = store.get();
  CommOptions options;
  options.backend = backend;
  options.timeout = milliseconds(5000);
  return make_communicator(options, *store, rank, world);
}

// Every collective of both ranks is in the (process-wide) recorder, numbered as the
// communicator counts its calls; the one that failed stays open, with the number the
// backend's own message gives it.
TEST(CheckedCommunicator, RecordsEveryCollectiveAsTheBackendNumbersIt) {
  for (const std::string backend : {"asio-ring", "shm"}) {
    flight_recorder().clear();
    testing::ScratchDir dir;
    std::vector<std::string> errors(2);
    std::vector<std::uint64_t> calls(2);
    testing::run_ranks(2, [&](int rank) {
      std::unique_ptr<Store> store;
      Store* s = nullptr;
      auto comm = make(dir, s, store, rank, 2, backend);
      std::vector<float> data(1000, 1.0f), gathered(2000), half(500);
      comm->allreduce(Buffer{data.data(), data.size(), DType::f32}, ReduceOp::sum);
      comm->broadcast(Buffer{data.data(), data.size(), DType::f32}, 1);
      comm->allgather(Buffer{data.data(), data.size(), DType::f32},
                      Buffer{gathered.data(), gathered.size(), DType::f32});
      comm->reduce_scatter(Buffer{data.data(), data.size(), DType::f32},
                           Buffer{half.data(), half.size(), DType::f32}, ReduceOp::sum);
      comm->barrier();
      EXPECT_FALSE(comm->last_algorithm().empty());
      // The ranks disagree on the size: both fail, naming the call.
      std::vector<float> odd(rank == 0 ? 100 : 101);
      try {
        comm->allreduce(Buffer{odd.data(), odd.size(), DType::f32}, ReduceOp::sum);
      } catch (const CommError& e) {
        errors[rank] = e.what();
      }
      calls[rank] = dynamic_cast<CheckedCommunicator&>(*comm).calls();
      try {
        comm->barrier();
        ADD_FAILURE() << backend << ": a failed communicator took another collective";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("broken by an earlier failure"), std::string::npos)
            << e.what();
      }
    });
    EXPECT_EQ(calls[0], 6u);
    EXPECT_EQ(calls[1], 6u);
    bool numbered = false;
    for (const auto& e : errors) numbered |= e.find("allreduce #6 ") != std::string::npos;
    EXPECT_TRUE(numbered) << backend << ": " << errors[0] << " | " << errors[1];
    const auto entries = flight_recorder().entries();
    ASSERT_EQ(entries.size(), 12u) << backend;  // six calls of each rank; the refused one not
    const CollectiveKind kinds[] = {CollectiveKind::allreduce, CollectiveKind::broadcast,
                                    CollectiveKind::allgather, CollectiveKind::reduce_scatter,
                                    CollectiveKind::barrier,   CollectiveKind::allreduce};
    int seen[7] = {};
    for (const FlightEntry& e : entries) {
      ASSERT_GE(e.seq, 1u);
      ASSERT_LE(e.seq, 6u);
      ++seen[e.seq];
      EXPECT_EQ(e.kind, kinds[e.seq - 1]) << backend << " #" << e.seq;
      if (e.seq < 6) {
        EXPECT_GE(e.end_s, e.start_s) << backend << " #" << e.seq;
        EXPECT_FALSE(e.algorithm_name().empty()) << backend << " #" << e.seq;
      } else {
        EXPECT_LT(e.end_s, 0) << "the failed collective never returned";
      }
    }
    for (int seq = 1; seq <= 6; ++seq) EXPECT_EQ(seen[seq], 2) << backend << " #" << seq;
  }
}

TEST(CheckedCommunicator, RefusesBuffersTheBackendCannotTake) {
  testing::ScratchDir dir;
  std::unique_ptr<Store> store;
  Store* s = nullptr;
  auto comm = make(dir, s, store, 0, 1, "asio-ring");
  const Capabilities can = comm->capabilities();
  EXPECT_TRUE(can.host_memory);
  EXPECT_FALSE(can.device_memory);
  EXPECT_TRUE(can.native_reduce_scatter);
  std::vector<float> a(8, 1.0f), b(8);
  EXPECT_THROW(comm->allreduce(Buffer{a.data(), 8, DType::f32, DeviceKind::cuda}, ReduceOp::sum),
               UsageError);
  EXPECT_THROW(comm->allreduce(Buffer{nullptr, 8, DType::f32}, ReduceOp::sum), UsageError);
  // reduce_scatter: sizes, types and memory must agree, and the output must not overlap.
  EXPECT_THROW(comm->reduce_scatter(Buffer{a.data(), 8, DType::f32},
                                    Buffer{b.data(), 4, DType::f32}, ReduceOp::sum),
               UsageError);
  EXPECT_THROW(comm->reduce_scatter(Buffer{a.data(), 8, DType::f32},
                                    Buffer{b.data(), 8, DType::i32}, ReduceOp::sum),
               UsageError);
  EXPECT_THROW(comm->reduce_scatter(Buffer{a.data(), 8, DType::f32},
                                    Buffer{a.data() + 4, 8, DType::f32}, ReduceOp::sum),
               UsageError);
  EXPECT_THROW(comm->broadcast(Buffer{a.data(), 8, DType::f32}, 1), UsageError);
  comm->reduce_scatter(Buffer{a.data(), 8, DType::f32}, Buffer{b.data(), 8, DType::f32},
                       ReduceOp::sum);
  EXPECT_EQ(b, a);
  // Refused calls are not collectives: the communicator still works.
  comm->barrier();
}

// A communicator of its own (a test double) gets the composed reduce_scatter: an allreduce of
// a copy, cut to this rank's block.
TEST(CheckedCommunicator, DefaultReduceScatterIsAnAllreduceOfACopy) {
  class Doubling final : public Communicator {  // two ranks holding the same values
   public:
    int rank() const override { return 1; }
    int size() const override { return 2; }
    std::string name() const override { return "doubling"; }
    void allreduce(Buffer buffer, ReduceOp) override {
      for (std::size_t i = 0; i < buffer.count; ++i) static_cast<float*>(buffer.data)[i] *= 2;
    }
    void broadcast(Buffer, int) override {}
    void allgather(const Buffer&, Buffer) override {}
    void barrier() override {}
  } comm;
  std::vector<float> in = {1, 2, 3, 4}, out(2);
  comm.reduce_scatter(Buffer{in.data(), 4, DType::f32}, Buffer{out.data(), 2, DType::f32},
                      ReduceOp::sum);
  EXPECT_EQ(out, (std::vector<float>{6, 8}));
  EXPECT_EQ(in, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_FALSE(comm.capabilities().native_reduce_scatter);
}

}  // namespace
}  // namespace partrain::comm
