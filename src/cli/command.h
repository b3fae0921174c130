// Subcommand registry: each cmd_*.cc adds itself with a static KILN_COMMAND registration, so the
// CLI grows without a shared list to edit.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace kiln::cli {

struct Command {
  std::string name;
  std::string help;
  // Adds options to `sub` and returns the action run after parsing; the action returns the exit code.
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { command_registry().push_back(std::move(c)); }
};

}  // namespace kiln::cli

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_COMMAND(name, help, setup_fn) \
  static ::kiln::cli::CommandRegistrar KILN_CONCAT(kiln_command_, __LINE__)({name, help, setup_fn})
