// `kiln`: parses the command line and runs one subcommand (see DESIGN.md §8).
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/log.h"

namespace kiln::cli {
std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace kiln::cli

int main(int argc, char** argv) {
  CLI::App app{"kiln: serve, benchmark and plan DeepSeek-V3-family MoE/MLA models"};
  app.require_subcommand(1);
  std::string log_level = "info";
  // spdlog reads a name it does not know as "off": a typo would silence everything.
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  std::function<int()> action;
  for (auto& cmd : kiln::cli::command_registry()) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.help);
    auto run = std::make_shared<std::function<int()>>();
    *run = cmd.setup(*sub);
    sub->callback([run, &action] { action = *run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  kiln::set_log_level(log_level);
  try {
    return action ? action() : 0;
  } catch (const kiln::cli::WorkerDone&) {
    return 0;  // a multi-process run's other rank: rank 0 finished
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln: error: %s\n", e.what());
    return 1;
  }
}
