// `kiln bench chart --gpu-bench FILE [--out FILE.svg]`: kiln-gpu-bench's JSON report drawn as
// bars, every figure as a fraction of the ceiling measured in its run, beside the targets.
// Runs anywhere (no GPU): docs/results/gpu_bench_h200.svg is drawn from the committed JSON.
#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>

#include "bench/gpu_chart.h"
#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"

namespace kiln::cli {
namespace {

struct BenchChartArgs {
  std::string gpu_bench, out, title = "Kiln: figures against the ceilings measured in the same run";
};

int run_bench_chart(const BenchChartArgs& a) {
  std::error_code ec;
  KILN_CHECK(std::filesystem::is_regular_file(a.gpu_bench, ec), "--gpu-bench {}: cannot read the file (not a file)",
             a.gpu_bench);
  const std::string out = a.out.empty() ? std::filesystem::path(a.gpu_bench).replace_extension(".svg").string() : a.out;
  require_output_file(out, "--out", {a.gpu_bench});  // a report named x.svg would be drawn over itself
  std::ifstream in(a.gpu_bench);
  KILN_CHECK(in.good(), "--gpu-bench {}: cannot read the file", a.gpu_bench);
  nlohmann::json report;
  try {
    report = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("--gpu-bench {}: not JSON ({})", a.gpu_bench, e.what());
  }
  // The whole chart first: a report that fails leaves no file behind.
  const std::vector<bench::ResultBar> bars = bench::gpu_bench_bars(report);
  const std::string svg = bench::render_bars(bars, a.title, bench::gpu_bench_subtitle(report));
  std::ofstream f(out);
  f << svg;
  KILN_CHECK(f.good(), "--out {}: cannot write the file", out);
  spdlog::info("wrote {} ({} bars)", out, bars.size());
  return 0;
}

KILN_SUBCOMMAND("bench", "chart", "Draw kiln-gpu-bench's JSON report as an SVG of fractions of the ceilings",
                [](CLI::App& sub) {
                  auto a = std::make_shared<BenchChartArgs>();
                  sub.add_option("--gpu-bench", a->gpu_bench, "kiln-gpu-bench --out JSON")->required();
                  sub.add_option("--out", a->out, "the SVG (default: the JSON's path with .svg)");
                  sub.add_option("--title", a->title, "chart title")->capture_default_str();
                  return [a] { return run_bench_chart(*a); };
                });

}  // namespace
}  // namespace kiln::cli
