// defines: `partrain validate CONFIG [--set k=v]...` — prints the resolved config.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.h"
#include "trainer/config/config.h"

namespace partrain::cli {

void add_config_arguments(CLI::App& sub, ConfigArguments& args) {
  sub.add_option("config", args.path, "YAML config file")->required();
  sub.add_option("--set", args.overrides, "Override a key: key.path=value (repeatable)");
}

void add_validate_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("validate", "Check a config and print it fully resolved");
  auto args = std::make_shared<ConfigArguments>();
  add_config_arguments(*sub, *args);
  sub->callback([args, &exit_code] {
    Config config = load_config(args->path, args->overrides);
    std::cout << "# " << args->path << ": valid\n" << config_to_yaml(config);
    exit_code = 0;
  });
}

}  // namespace partrain::cli
