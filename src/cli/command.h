// Subcommand registry: each cmd_*.cc adds itself with a static KILN_COMMAND registration, so the
// CLI grows without a shared list to edit.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <memory>
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

// Commands with their own subcommands (`kiln bench serve`, `kiln bench model`): each child
// registers under its parent's name with KILN_SUBCOMMAND, in its own cmd_*.cc, and the parent adds
// whatever registered when it sets itself up (add_registered_subcommands). Function-local statics,
// so registration order across files does not matter.
inline std::map<std::string, std::vector<Command>>& subcommand_registry() {
  static std::map<std::string, std::vector<Command>> children;
  return children;
}

struct SubcommandRegistrar {
  SubcommandRegistrar(const std::string& parent, Command c) { subcommand_registry()[parent].push_back(std::move(c)); }
};

// Adds every child registered under `parent` to `app` (requiring one) and returns the action of
// whichever the command line chose.
inline std::function<int()> add_registered_subcommands(const std::string& parent, CLI::App& app) {
  auto chosen = std::make_shared<std::function<int()>>();
  for (auto& child : subcommand_registry()[parent]) {
    CLI::App* sub = app.add_subcommand(child.name, child.help);
    auto run = std::make_shared<std::function<int()>>(child.setup(*sub));
    sub->callback([run, chosen] { *chosen = *run; });
  }
  app.require_subcommand(1);
  return [chosen] { return *chosen ? (*chosen)() : 0; };
}

}  // namespace kiln::cli

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_COMMAND(name, help, setup_fn) \
  static ::kiln::cli::CommandRegistrar KILN_CONCAT(kiln_command_, __LINE__)({name, help, setup_fn})
#define KILN_SUBCOMMAND(parent, name, help, setup_fn) \
  static ::kiln::cli::SubcommandRegistrar KILN_CONCAT(kiln_subcommand_, __LINE__)(parent, {name, help, setup_fn})
