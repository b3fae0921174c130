// `kiln bench ...`: the parent of the benchmark commands. Each one (`serve` in cmd_bench_serve.cc,
// `model` for offline engine throughput) registers itself with KILN_SUBCOMMAND("bench", ...).
#include "cli/command.h"

namespace kiln::cli {
namespace {

KILN_COMMAND("bench", "Benchmarks: `serve` measures any OpenAI-compatible server",
             [](CLI::App& sub) { return add_registered_subcommands("bench", sub); });

}  // namespace
}  // namespace kiln::cli
