// defines: main() of the partrain executable — subcommand dispatch and the exit-code rule:
// 0 success, 1 the run failed, 2 bad usage, config or input (one line on stderr).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "common/errors.h"
#include "common/worker_lines.h"

namespace {

// The one line for the user; with PARTRAIN_DEBUG=1 also where in partrain's source the error
// was raised, for a bug report.
void report(const partrain::Error& e) {
  std::cerr << "partrain: " << e.what();
  const char* debug = std::getenv("PARTRAIN_DEBUG");
  if (debug && std::string(debug) == "1" && !e.source().empty())
    std::cerr << " [" << e.source() << "]";
  std::cerr << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"partrain: data-parallel training of LibTorch models", "partrain"};
  app.require_subcommand(1);
  int exit_code = 0;
  namespace pc = partrain::cli;
#ifdef PARTRAIN_WITH_TORCH
  pc::add_run_command(app, exit_code);
  pc::add_worker_command(app, exit_code);
  pc::add_export_command(app, exit_code);
#endif
  pc::add_validate_command(app, exit_code);
  pc::add_bench_command(app, exit_code);
  pc::add_parity_command(app, exit_code);
  pc::add_explain_command(app, exit_code);
  pc::add_data_command(app, exit_code);
  pc::add_version_command(app, exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "partrain: " << e.what() << " (see partrain --help)\n";
    return 2;
  } catch (const partrain::UsageError& e) {
    report(e);
    return 2;
  } catch (const partrain::PeerError& e) {
    // The launcher reads this line to name, in its own verdict, the rank this one lost.
    std::cerr << partrain::format_lost_rank_line(e.peer_rank(), e.what()) << "\n";
    return 1;
  } catch (const partrain::Error& e) {
    report(e);
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "partrain: internal error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
