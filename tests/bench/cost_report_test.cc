// The cost columns of a sweep point and the printed table reproduce the published comparison
// table from its raw inputs: 952 tok/s on 8 GPUs at $2.50 -> 119 per GPU, 48 per $/GPU-hr; 498 on
// 16 at $4.25 -> 31 and 7; 1,568 on 8 at $6.00 -> 196 and 33. And the chart marks the Pareto front.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "bench/report.h"
#include "bench/svg.h"

namespace kiln::bench {
namespace {

PointSummary point(double out_tok_s, double decode_per_stream, int64_t concurrency, const CostSpec& c) {
  PointSummary s;
  s.concurrency = concurrency;
  s.completed = 10;
  s.output_tok_s = out_tok_s;
  s.per_stream_decode_tok_s = decode_per_stream;
  apply_cost(s, c);
  return s;
}

TEST(BenchCostReport, ReproducesThePublishedTable) {
  struct Row {
    double peak_aggregate;
    int64_t gpus;
    double price;
    long per_gpu, per_usd;
    const char *per_gpu_cell, *per_usd_cell;
  };
  const Row rows[] = {{952, 8, 2.50, 119, 48, "119", "47.6"},
                      {498, 16, 4.25, 31, 7, "31.1", "7.32"},
                      {1568, 8, 6.00, 196, 33, "196", "32.7"}};
  for (const Row& r : rows) {
    SCOPED_TRACE(r.peak_aggregate);
    const PointSummary s = point(r.peak_aggregate, 100, 64, CostSpec{r.gpus, r.price});
    EXPECT_EQ(std::lround(s.output_tok_s_per_gpu), r.per_gpu);
    EXPECT_EQ(std::lround(s.output_tok_s_per_usd_gpu_hour), r.per_usd);
    // $ per million output tokens: the deployment's hourly price over an hour's tokens.
    EXPECT_NEAR(s.usd_per_million_output_tokens, r.gpus * r.price / (r.peak_aggregate * 3600) * 1e6, 1e-9);
    const std::string table = format_table({s});
    EXPECT_NE(table.find(fmt::format(" {} |", r.per_gpu_cell)), std::string::npos) << table;
    EXPECT_NE(table.find(fmt::format(" {} |", r.per_usd_cell)), std::string::npos) << table;
    EXPECT_EQ(table.find("J/output tok"), std::string::npos) << "no power column without a power figure";
  }
  // 8 GPUs at $2.50 cost $20 an hour; 952 tok/s make 3.4272 M tokens in it: $5.84 per million.
  EXPECT_NE(format_table({point(952, 118, 64, CostSpec{8, 2.5})}).find("$5.84"), std::string::npos);
}

// An unknown GPU count (no --gpus) gives no per-GPU column and no per-GPU figure, not "1 GPU".
TEST(BenchCostReport, NoGpuCountNoPerGpuColumn) {
  const PointSummary s = point(952, 118, 64, CostSpec{});
  EXPECT_TRUE(std::isnan(s.output_tok_s_per_gpu));
  EXPECT_TRUE(to_json(s)["gpus"].is_null());
  EXPECT_TRUE(to_json(s)["output_tok_s_per_gpu"].is_null());
  const std::string table = format_table({s});
  EXPECT_EQ(table.find("per GPU"), std::string::npos) << table;
  EXPECT_NE(table.find(" 952 |"), std::string::npos) << table;
  EXPECT_NE(format_table({point(952, 118, 64, CostSpec{8})}).find("tok/s per GPU (8)"), std::string::npos);
  // The chart plots the whole server's throughput instead, and says so.
  const std::string svg = render_chart({s}, "t", "s");
  EXPECT_NE(svg.find("output tok/s (whole server)"), std::string::npos);
  EXPECT_EQ(svg.find("per GPU"), std::string::npos);
}

TEST(BenchCostReport, PowerColumns) {
  // 8 x 0.7 kW at PUE 1.25 = 7 kW facility; at 1400 tok/s that is 5 J per token. Per hour: $16 of
  // GPU time + 7 kWh x $0.10 = $16.70 over 5.04 M tokens.
  const PointSummary s = point(1400, 50, 32, CostSpec{8, 2.0, 0.7, 0.10, 1.25});
  EXPECT_DOUBLE_EQ(s.joules_per_output_token, 5.0);
  EXPECT_NEAR(s.usd_per_million_output_tokens_with_power, 16.7 / 5.04, 1e-9);
  EXPECT_NEAR(s.usd_per_million_output_tokens, 16.0 / 5.04, 1e-9);
  const std::string table = format_table({s});
  EXPECT_NE(table.find("J/output tok"), std::string::npos);
  EXPECT_NE(table.find(" 5.00 |"), std::string::npos) << table;
  EXPECT_NE(table.find("$3.31"), std::string::npos) << table;
  const nlohmann::json j = to_json(s);
  EXPECT_DOUBLE_EQ(j["joules_per_output_token"].get<double>(), 5.0);
  EXPECT_FALSE(to_json(point(1, 1, 1, CostSpec{})).contains("joules_per_output_token"));
}

TEST(BenchCostReport, FigureFormatting) {
  EXPECT_EQ(format_figure(952), "952");
  EXPECT_EQ(format_figure(31.125), "31.1");
  EXPECT_EQ(format_figure(7.3235), "7.32");
  EXPECT_EQ(format_figure(0), "0");
  EXPECT_EQ(format_figure(99.97), "100");
  EXPECT_EQ(format_figure(9.996), "10.0");
}

TEST(BenchCostReport, ParetoFrontAndChart) {
  // (per-user, per-GPU): c=1 (100, 10), c=4 (90, 35), c=16 (60, 80), c=8 (50, 30) is dominated
  // by c=16, c=64 (20, 80) is dominated by c=16 (equal y, lower x).
  const std::vector<double> x = {100, 90, 60, 50, 20}, y = {10, 35, 80, 30, 80};
  EXPECT_EQ(pareto_front(x, y), (std::vector<size_t>{2, 1, 0}));
  EXPECT_TRUE(pareto_front({0, 5}, {7, 0}).empty());
  std::vector<PointSummary> pts;
  const int64_t conc[] = {1, 4, 16, 8, 64};
  for (size_t i = 0; i < x.size(); ++i) pts.push_back(point(y[i], x[i], conc[i], CostSpec{1}));
  const std::string svg = render_chart(pts, "Kiln <TP8> & co", "random, 1024 in / 400 out");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("Kiln &lt;TP8&gt; &amp; co"), std::string::npos);
  EXPECT_NE(svg.find("class=\"pareto-front\""), std::string::npos);
  size_t on_front = 0;
  for (size_t p = 0; (p = svg.find("class=\"point pareto\"", p)) != std::string::npos; ++p) ++on_front;
  EXPECT_EQ(on_front, 3u);
  EXPECT_NE(svg.find(">c=64<"), std::string::npos);
}

}  // namespace
}  // namespace kiln::bench
