// defines: `partrain version` — LibTorch version, CUDA, the backends compiled in, the malloc.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.h"
#include "comm_backends/communicator.h"
#ifdef PARTRAIN_WITH_TORCH
#include "trainer/device/torch_info.h"
#endif

namespace partrain::cli {

void add_version_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("version", "Print versions and the backends compiled in");
  sub->callback([&exit_code] {
    std::cout << "partrain " << PARTRAIN_VERSION << "\n";
#ifdef PARTRAIN_WITH_TORCH
    std::cout << describe_torch();
#else
    std::cout << "libtorch: not built (PARTRAIN_WITH_TORCH=OFF)\n";
#endif
    std::cout << "backends:";
    const char* separator = " ";
    for (const auto& name : comm::backend_names()) {
      std::cout << separator << name
                << (comm::backend_compiled_in(name) ? "" : " (not compiled in)");
      separator = ", ";
    }
    std::cout << "\n";
    std::cout << "malloc: " << PARTRAIN_MALLOC << "\n";
    exit_code = 0;
  });
}

}  // namespace partrain::cli
