// `kiln bench chart`: kiln-gpu-bench's report read into bars (labels, fractions, the issue's
// targets), drawn as SVG (a bar short of its target is orange, one at or past it green), bad
// reports and files named by what is at fault with no file left behind, and the committed H200
// chart equal to what the code draws from the committed report.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "bench/gpu_chart.h"
#include "bench_test_util.h"
#include "core/error.h"
#include "test_util.h"

namespace kiln::bench {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json small_report() {
  return json::parse(R"J({
    "device": "cuda (Test GPU)",
    "ceilings": {"copy_gbps": 4000, "bf16_gemm_tflops": 900},
    "models": [{
      "model": "m",
      "decode": [{"batch": 1, "tok_s_aggregate": 450.4, "fraction_of_ceiling": 0.55},
                 {"batch": 8, "tok_s_aggregate": 1061, "fraction_of_ceiling": 0.56}],
      "decode_bf16_activations": [{"batch": 32, "tok_s_aggregate": 3329, "fraction_of_ceiling": 0.73}],
      "prefill": [{"prompt": 1024, "prompts": 1, "tok_s": 43822, "fraction_of_bf16_gemm": 0.225},
                  {"prompt": 1024, "prompts": 8, "tok_s": 55690, "fraction_of_bf16_gemm": 0.286},
                  {"prompt": 512, "prompts": 1, "tok_s": 40000, "fraction_of_bf16_gemm": 0.2}],
      "prefill_bf16_activations": [{"prompt": 8192, "tok_s": 73238, "fraction_of_bf16_gemm": 0.457}]
    }, {"model": "second, not drawn", "decode": [], "prefill": []}],
    "mla_decode_kernel": [
      {"heads": 16, "context": 8192, "batch": 128, "gbps": 3476, "fraction_of_copy_bw": 0.808},
      {"heads": 16, "context": 4096, "batch": 128, "gbps": 3380, "fraction_of_copy_bw": 0.786},
      {"heads": 128, "context": 8192, "batch": 128, "gbps": 621, "fraction_of_copy_bw": 0.144}]
  })J");
}

TEST(GpuChart, ReportBecomesBarsWithTargets) {
  const std::vector<ResultBar> bars = gpu_bench_bars(small_report());
  ASSERT_EQ(bars.size(), 8u);
  EXPECT_EQ(bars[0].label, "1 stream");
  EXPECT_EQ(bars[0].value, "450 tok/s");
  EXPECT_DOUBLE_EQ(bars[0].fraction, 0.55);
  EXPECT_DOUBLE_EQ(bars[0].target, 0.60);  // single-stream decode: 60% of the HBM ceiling
  EXPECT_EQ(bars[1].label, "8 streams");
  EXPECT_TRUE(std::isnan(bars[1].target));
  EXPECT_EQ(bars[2].label, "32 streams, bf16 act.");
  EXPECT_EQ(bars[3].label, "1024 tokens");
  EXPECT_DOUBLE_EQ(bars[3].target, 0.40);  // prefill of one prompt: 40% of the bf16 rate
  EXPECT_EQ(bars[4].label, "8 x 1024 tokens");
  EXPECT_TRUE(std::isnan(bars[4].target));  // not one of the issue's single-prompt figures
  EXPECT_EQ(bars[5].label, "512 tokens");
  EXPECT_TRUE(std::isnan(bars[5].target));             // the issue's prompts are 1k and 8k
  EXPECT_EQ(bars[6].label, "8192 tokens, bf16 act.");  // no "prompts": one
  EXPECT_DOUBLE_EQ(bars[6].target, 0.40);
  EXPECT_EQ(bars[7].label, "context 8192");  // 16 heads, batch 128, 8k+ only
  EXPECT_EQ(bars[7].value, "3476 GB/s");
  EXPECT_DOUBLE_EQ(bars[7].target, 0.70);
  EXPECT_NE(bars[0].group, bars[3].group);
  EXPECT_EQ(gpu_bench_subtitle(small_report()),
            "cuda (Test GPU): ceilings measured in the run, copy 4000 GB/s, bf16 GEMM 900 TFLOP/s");
}

TEST(GpuChart, KernelOnlyReportDraws) {  // kiln-gpu-bench --skip-model
  json r = small_report();
  r.erase("models");
  const std::vector<ResultBar> bars = gpu_bench_bars(r);
  ASSERT_EQ(bars.size(), 1u);
  EXPECT_EQ(bars[0].group, "MLA decode kernel, 16 heads, batch 128, unknown cache (fraction of copy bandwidth)");
}

TEST(GpuChart, SvgColoursBarsByTarget) {
  const std::string svg = render_bars(gpu_bench_bars(small_report()), "Kiln <H200> & co", "sub");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("Kiln &lt;H200&gt; &amp; co"), std::string::npos);
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t p = 0; (p = svg.find(what, p)) != std::string::npos; ++p) ++n;
    return n;
  };
  EXPECT_EQ(count("<g class=\"bar\">"), 8u);
  EXPECT_EQ(count("class=\"target\""), 4u);
  // Legend swatches aside: 1 stream and 1k short of their targets, 8k bf16 and the kernel past them.
  EXPECT_EQ(count("fill=\"#ff7f0e\""), 1u + 2u);
  EXPECT_EQ(count("fill=\"#2ca02c\""), 1u + 2u);
  EXPECT_NE(svg.find("55.0%  450 tok/s"), std::string::npos);
}

TEST(GpuChart, BadReportsNameTheField) {
  auto error_of = [](const json& j) {
    try {
      gpu_bench_bars(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(json::object()).find("no figures to draw"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(json{{"models", json::array()}}).find("non-empty array"), std::string::npos);
  json r = small_report();
  r["models"][0]["decode"][1].erase("batch");
  EXPECT_NE(error_of(r).find("m.decode[1] has no \"batch\""), std::string::npos) << error_of(r);
  r = small_report();
  r["models"][0]["prefill"][0]["tok_s"] = "fast";
  EXPECT_NE(error_of(r).find("m.prefill[0].tok_s is not a number"), std::string::npos) << error_of(r);
  r = small_report();  // rows, but none of them drawn
  r["models"][0] = json{{"model", "m"}, {"decode", json::array()}, {"prefill", json::array()}};
  r["mla_decode_kernel"] = json::array();
  EXPECT_NE(error_of(r).find("no figures to draw"), std::string::npos) << error_of(r);
  r = small_report();
  r["models"][0]["decode"] = json::object();
  EXPECT_NE(error_of(r).find("m.decode is not an array"), std::string::npos) << error_of(r);
  for (double f : {1e307, -0.1}) {  // 1e307 once scaled the chart to NaN coordinates
    r = small_report();
    r["models"][0]["prefill"][0]["fraction_of_bf16_gemm"] = f;
    EXPECT_NE(error_of(r).find("not a fraction of a ceiling"), std::string::npos) << error_of(r);
  }
  EXPECT_THROW(gpu_bench_subtitle(json::object()), Error);
}

// The committed chart is what the code draws from the committed report with the default title:
// after a new report or a renderer change, redraw it with
// `kiln bench chart --gpu-bench docs/results/gpu_bench_h200.json`.
TEST(GpuChart, CommittedH200ChartMatchesItsReport) {
  const fs::path dir = kiln::test::repo_root() / "docs/results";
  const json r = kiln::test::read_json((dir / "gpu_bench_h200.json").string());
  const std::vector<ResultBar> bars = gpu_bench_bars(r);
  for (const ResultBar& b : bars) {
    EXPECT_GT(b.fraction, 0.0) << b.label;
    EXPECT_LT(b.fraction, 1.0) << b.label;  // a fraction of a ceiling measured in the same run
  }
  const std::string want = test::slurp((dir / "gpu_bench_h200.svg").string());
  EXPECT_EQ(render_bars(bars, "Kiln: figures against the ceilings measured in the same run", gpu_bench_subtitle(r)),
            want)
      << "docs/results/gpu_bench_h200.svg is stale: redraw it with kiln bench chart";
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("kiln_chart_" + std::to_string(getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

TEST(GpuChart, CliWritesTheSvgAndNamesBadFiles) {
  TempDir tmp;
  std::ofstream(tmp.file("r.json")) << small_report().dump();
  auto r = kiln::test::run_kiln("bench chart --gpu-bench " + tmp.file("r.json"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(test::slurp(tmp.file("r.svg")).rfind("<svg", 0), 0u);  // default: beside the JSON
  r = kiln::test::run_kiln("bench chart --gpu-bench " + tmp.file("r.json") + " --out " + tmp.file("c.svg") +
                           " --title 'Test title'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(test::slurp(tmp.file("c.svg")).find(">Test title<"), std::string::npos);
  struct Bad {
    std::string name, content, message;
  };
  for (const Bad& bad :
       {Bad{"missing.json", "", "cannot read the file"}, Bad{"bad.json", "{not json", "not JSON"},
        Bad{"huge.json", R"({"models": 1e400})", "not JSON"}, Bad{"empty.json", "{}", "no figures to draw"}}) {
    if (!bad.content.empty()) std::ofstream(tmp.file(bad.name)) << bad.content;
    r = kiln::test::run_kiln("bench chart --gpu-bench " + tmp.file(bad.name));
    EXPECT_NE(r.exit_code, 0) << bad.name;
    EXPECT_NE(r.out.find(bad.message), std::string::npos) << bad.name << ": " << r.out;
    EXPECT_FALSE(fs::exists(fs::path(tmp.file(bad.name)).replace_extension(".svg"))) << bad.name;
  }
  r = kiln::test::run_kiln("bench chart --gpu-bench " + tmp.path.string());  // a directory
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("not a file"), std::string::npos) << r.out;
  // A report named *.svg (its default output) or --out naming the report: refused, the report kept.
  const std::string report = small_report().dump();
  std::ofstream(tmp.file("report.svg")) << report;
  for (const std::string& out : {std::string(), " --out " + tmp.file("report.svg")}) {
    r = kiln::test::run_kiln("bench chart --gpu-bench " + tmp.file("report.svg") + out);
    EXPECT_NE(r.exit_code, 0) << out;
    EXPECT_NE(r.out.find("is an input of this run"), std::string::npos) << r.out;
    EXPECT_EQ(test::slurp(tmp.file("report.svg")), report);
  }
  r = kiln::test::run_kiln("bench chart --gpu-bench " + tmp.file("r.json") + " --out /nonexistent/c.svg");
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kiln::bench
