// defines: `partrain version` — LibTorch version, CUDA, the backends (which can run here, and
// why not the others), the TCP congestion control they take, the malloc.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.h"
#include "comm_backends/communicator.h"
#include "comm_backends/cuda_stream.h"
#ifdef PARTRAIN_WITH_TORCH
#include "trainer/device/torch_info.h"
#endif

namespace partrain::cli {

namespace {

// Each backend's own answer for several ranks on this host, their buffers on a CUDA device
// when there is one: the question `auto` asks of each, in its order.
void print_backends() {
  const comm::RankHosts ranks(comm::layout_on_this_host(2));
  const comm::Placement here{
      comm::cuda_device_count() > 0 ? comm::DeviceKind::cuda : comm::DeviceKind::cpu, ranks};
  std::cout << "backends, in the order auto tries them, for ranks on this host:\n";
  for (const auto& backend : comm::probe_backends(here)) {
    std::cout << "  " << backend.name << ": ";
    if (!backend.compiled_in) {
      std::cout << "not compiled in: " << backend.why_not << "\n";
    } else if (!backend.why_not.empty()) {
      std::cout << "compiled in, not usable here: " << backend.why_not << "\n";
    } else {
      std::cout << "usable\n";
    }
  }
  std::cout << "  auto: " << comm::choose_backend("auto", here) << "\n";
  // asio-ring's and hierarchical's TCP connections (comm.tcp_congestion).
  std::cout << "tcp congestion control: " << comm::describe_tcp_congestion() << "\n";
}

}  // namespace

void add_version_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("version", "Print versions and which backends can run here");
  sub->callback([&exit_code] {
    std::cout << "partrain " << PARTRAIN_VERSION << "\n";
#ifdef PARTRAIN_WITH_TORCH
    std::cout << describe_torch();
#else
    std::cout << "libtorch: not built (PARTRAIN_WITH_TORCH=OFF)\n";
#endif
    print_backends();
    std::cout << "malloc: " << PARTRAIN_MALLOC << "\n";
    exit_code = 0;
  });
}

}  // namespace partrain::cli
