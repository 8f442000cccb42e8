// Runs launch() in a process of its own, so tests can do to a launcher what a terminal or
// a crash does: send it SIGINT, or SIGKILL it.
//
//   launcher_driver [--nproc N] [--grace-ms G] [--max-restarts R] -- EXECUTABLE ARGS...
#include <iostream>
#include <string>

#include "cli/launcher.h"
#include "common/errors.h"

int main(int argc, char** argv) {
  partrain::cli::LaunchPlan plan;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) {
      std::cerr << "launcher_driver: " << arg << " needs a value\n";
      return 64;
    }
    const int value = std::stoi(argv[++i]);
    if (arg == "--nproc") {
      plan.nodes = partrain::NodeLayout::per_node({value});
    } else if (arg == "--grace-ms") {
      plan.grace = std::chrono::milliseconds(value);
    } else if (arg == "--max-restarts") {
      plan.max_restarts = value;
    } else {
      std::cerr << "launcher_driver: unknown option " << arg << "\n";
      return 64;
    }
  }
  if (i >= argc) {
    std::cerr << "launcher_driver: no executable after --\n";
    return 64;
  }
  plan.executable = argv[i++];
  for (; i < argc; ++i) plan.worker_args.push_back(argv[i]);
  try {
    return partrain::cli::launch(plan);
  } catch (const partrain::UsageError& e) {
    std::cerr << "partrain: " << e.what() << "\n";
    return 2;
  } catch (const partrain::Error& e) {
    std::cerr << "partrain: " << e.what() << "\n";
    return 1;
  }
}
