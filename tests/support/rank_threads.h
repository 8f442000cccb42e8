// defines: run_ranks() — a world of ranks as threads of one test process.
#pragma once

#include <exception>
#include <thread>
#include <vector>

namespace partrain::testing {

// Runs body(rank) on `world` threads; rethrows the first exception after all have joined.
template <typename Body>
void run_ranks(int world, Body&& body) {
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

}  // namespace partrain::testing
