// defines: TempDir, run_ranks() — a world of ranks as threads of one test process.
#pragma once

#include <atomic>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace partrain::comm::testing {

// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::random_device random;
    path_ = std::filesystem::temp_directory_path() /
            ("partrain-comm-" + std::to_string(random()) + "-" + std::to_string(random()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string url() const { return "file://" + path_.string(); }

 private:
  std::filesystem::path path_;
};

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

}  // namespace partrain::comm::testing
