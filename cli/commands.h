// defines: the add_*_command functions, one per subcommand file, that main.cpp calls, and
// ConfigArguments, the config options they share.
//
// Each adds its subcommand to the root CLI11 app; the callback does the work and stores the
// process exit code in `exit_code`. Errors are thrown (UsageError -> 2, Error -> 1) and
// turned into one line on stderr by main.cpp.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace partrain::cli {

// CONFIG and --set key.path=value, as run, worker and validate take them.
struct ConfigArguments {
  std::string path;
  std::vector<std::string> overrides;
};
void add_config_arguments(CLI::App& sub, ConfigArguments& args);  // validate_command.cpp

void add_run_command(CLI::App& app, int& exit_code);         // run_command.cpp (launcher)
void add_worker_command(CLI::App& app, int& exit_code);      // worker_command.cpp
void add_validate_command(CLI::App& app, int& exit_code);    // validate_command.cpp
void add_bench_command(CLI::App& app, int& exit_code);       // bench_command.cpp
void add_rendezvous_bench(CLI::App& bench, int& exit_code);  // bench_rendezvous.cpp
void add_parity_command(CLI::App& app, int& exit_code);      // parity_command.cpp
void add_explain_command(CLI::App& app, int& exit_code);     // explain_command.cpp
void add_data_command(CLI::App& app, int& exit_code);        // data_command.cpp
void add_version_command(CLI::App& app, int& exit_code);     // version_command.cpp
void add_export_command(CLI::App& app, int& exit_code);      // export_command.cpp

// Whole lines of stdout reach a pipe as they are printed, so that a rank's stop in its start-up,
// which ends the process without flushing (common/stop_request.h), loses none: line-buffered,
// or unbuffered on Windows, whose C runtime takes line buffering for full buffering. Call it
// before anything is printed. worker_command.cpp.
void line_buffer_stdout();

}  // namespace partrain::cli
