// defines: `partrain validate CONFIG [--set k=v]...` — prints the resolved config.
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.h"
#include "trainer/config/config.h"

namespace partrain::cli {

void add_validate_command(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("validate", "Check a config and print it fully resolved");
  auto config_path = std::make_shared<std::string>();
  auto overrides = std::make_shared<std::vector<std::string>>();
  sub->add_option("config", *config_path, "YAML config file")->required();
  sub->add_option("--set", *overrides, "Override a key: key.path=value (repeatable)");
  sub->callback([config_path, overrides, &exit_code] {
    Config config = load_config(*config_path, *overrides);
    std::cout << "# " << *config_path << ": valid\n" << config_to_yaml(config);
    exit_code = 0;
  });
}

}  // namespace partrain::cli
