// defines: LateRankRing — an asio-ring world of ranks as threads in which rank 0 comes last,
// so that a test can knock on rank 1's ring port, where it waits for rank 0, before the ring
// forms; then rank 0 comes and every rank's allreduce must still give the right sum.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm_backends/backends/backend.h"
#include "comm_backends/communicator.h"
#include "comm_backends/net/timed_io.h"
#include "comm_backends/peer/peer_transport.h"
#include "comm_backends/store/store.h"
#include "tests/support/rank_threads.h"
#include "tests/support/scratch_dir.h"

namespace partrain::testing {

class LateRankRing {
 public:
  // Starts ranks 1 .. world-1, each to allreduce (sum) `elements` floats of rank + 1, and
  // waits until rank 1 has published its ring port (host() and port()).
  LateRankRing(int world, std::string token, std::size_t elements)
      : world_(world), token_(std::move(token)), elements_(elements) {
    others_ = std::thread([this] {
      try {
        run_ranks(world_ - 1, [this](int i) { run_rank(i + 1); });
      } catch (...) {
        others_error_ = std::current_exception();
      }
    });
    try {
      // The first communicator made on this store is asio-ring's: its keys are instance 1's.
      auto store = comm::open_store(dir_.url(), store_options());
      const auto bytes =
          store->get(comm::asio_ring_address_key(comm::communicator_key_prefix(1, "asio-ring"), 1));
      const std::string address =
          comm::decode_peer_address(std::string(bytes.begin(), bytes.end())).listen;
      if (!comm::net::split_host_port(address, host_, port_)) {
        throw std::runtime_error("rank 1 published a ring address that is not host:port: " +
                                 address);
      }
    } catch (...) {
      others_.join();  // bounded: the others give up after kTimeout
      throw;
    }
  }

  // Should the test end early, the others give up when the timeout (kTimeout) passes.
  ~LateRankRing() {
    if (others_.joinable()) others_.join();
  }
  LateRankRing(const LateRankRing&) = delete;
  LateRankRing& operator=(const LateRankRing&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  const std::string& token() const { return token_; }

  // Runs rank 0, waits for the others and rethrows the first failure of any rank.
  void complete() {
    run_rank(0);
    others_.join();
    if (others_error_) std::rethrow_exception(others_error_);
  }

 private:
  static constexpr std::chrono::milliseconds kTimeout{10000};

  comm::StoreOptions store_options() const {
    comm::StoreOptions options;
    options.token = token_;
    options.timeout = kTimeout;
    return options;
  }

  void run_rank(int rank) {
    auto store = comm::open_store(dir_.url(), store_options());
    comm::CommOptions options;
    options.backend = "asio-ring";
    options.token = token_;
    options.timeout = kTimeout;
    auto comm = comm::make_communicator(options, *store, rank, world_);
    std::vector<float> data(elements_, static_cast<float>(rank + 1));
    comm->allreduce(comm::Buffer{data.data(), data.size(), comm::DType::f32}, comm::ReduceOp::sum);
    const float expected = static_cast<float>(world_ * (world_ + 1) / 2);
    for (float v : data) ASSERT_EQ(v, expected) << "rank " << rank;
  }

  const int world_;
  const std::string token_;
  const std::size_t elements_;
  ScratchDir dir_{"partrain-ring"};
  std::exception_ptr others_error_;
  std::thread others_;
  std::string host_;
  int port_ = 0;
};

}  // namespace partrain::testing
