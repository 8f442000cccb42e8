// One rank as its own process, for the tests that kill or freeze a rank:
//   comm_rank_process STORE_URL RANK WORLD BACKEND TIMEOUT_MS READY_FILE [BIND_HOST]
// It runs checked allreduces until one fails (or for at most a minute), touching READY_FILE
// after the first. With a tcp:// store, rank 0 serves it. Exit: 0 done, 3 PeerError (stderr:
// "peer-error rank=N: ..."), 1 other.
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "comm_backends/backends/peer_process.h"
#include "comm_backends/communicator.h"
#include "comm_backends/store/store.h"
#include "common/errors.h"

int main(int argc, char** argv) {
  using namespace partrain::comm;
  if (argc != 7 && argc != 8) {
    std::cerr << "usage: comm_rank_process STORE_URL RANK WORLD BACKEND TIMEOUT_MS READY_FILE "
                 "[BIND_HOST]\n";
    return 2;
  }
  const int rank = std::stoi(argv[2]);
  const int world = std::stoi(argv[3]);
  try {
    StoreOptions store_options;
    store_options.token = "process-test";
    store_options.timeout = std::chrono::milliseconds(20000);
    store_options.rank = rank;
    store_options.world_size = world;
    // Over tcp, rank 0 serves the store, as under an engine (open_rank_group()).
    store_options.host_server = rank == 0 && std::string(argv[1]).rfind("tcp://", 0) == 0;
    publish_process_on_join(store_options, rank);  // as open_rank_group() does
    auto store = open_store(argv[1], store_options);
    CommOptions options;
    options.backend = argv[4];
    options.token = "process-test";
    options.timeout = std::chrono::milliseconds(std::stoi(argv[5]));
    if (argc == 8) options.bind_host = argv[7];  // a host of its own: its address there
    auto comm = make_communicator(options, *store, rank, world);
    std::vector<float> data(1 << 14);
    const auto stop = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    for (int iteration = 0; std::chrono::steady_clock::now() < stop; ++iteration) {
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank + i % 7);
      comm->allreduce(Buffer{data.data(), data.size(), DType::f32}, ReduceOp::sum);
      for (std::size_t i = 0; i < data.size(); ++i) {
        const float want = static_cast<float>(world * (world - 1) / 2 + world * (i % 7));
        if (data[i] != want) {
          std::cerr << "wrong result at " << i << "\n";
          return 1;
        }
      }
      if (iteration == 0) std::ofstream(argv[6]) << "ready\n";
    }
    return 0;
  } catch (const partrain::PeerError& e) {
    std::cerr << "peer-error rank=" << e.peer_rank() << ": " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
