// bench/cost.h: the per-GPU, per-$ and per-token arithmetic every report shares.
#include <gtest/gtest.h>

#include <cmath>

#include "bench/cost.h"

namespace kiln::bench {
namespace {

struct Row {
  double tok_s;
  int64_t gpus;
  double price;
  long per_gpu;     // as the benchmark issue's table prints it
  long per_dollar;  // tok/s per GPU per $/GPU-hour, rounded
};

// The table in the benchmark issue: 952 tok/s on 8 GPUs at $2.50 -> 119 and 48; 498 on 16 at
// $4.25 -> 31 and 7; 1,568 on 8 at $6.00 -> 196 and 33.
TEST(Cost, MatchesTheBenchmarkIssueTable) {
  const Row rows[] = {{952, 8, 2.50, 119, 48}, {498, 16, 4.25, 31, 7}, {1568, 8, 6.00, 196, 33}};
  for (const Row& r : rows) {
    SCOPED_TRACE(r.tok_s);
    EXPECT_EQ(std::lround(tok_s_per_gpu(r.tok_s, r.gpus)), r.per_gpu);
    EXPECT_EQ(std::lround(tok_s_per_usd_gpu_hour(r.tok_s, r.gpus, r.price)), r.per_dollar);
  }
  EXPECT_DOUBLE_EQ(tok_s_per_gpu(952, 8), 119.0);
  EXPECT_DOUBLE_EQ(tok_s_per_usd_gpu_hour(952, 8, 2.5), 47.6);
  EXPECT_DOUBLE_EQ(tok_s_per_gpu(498, 16), 31.125);
  EXPECT_NEAR(tok_s_per_usd_gpu_hour(1568, 8, 6.0), 32.6667, 1e-4);
}

TEST(Cost, DollarsPerMillionTokens) {
  // 8 GPUs at $2.50 cost $20/h; 952 tok/s make 3,427,200 tokens an hour.
  EXPECT_NEAR(usd_per_million_tokens(952, 8, 2.5), 20.0 / 3.4272, 1e-9);
  // One GPU at $3.60/h making 1000 tok/s: 3.6 M tokens per hour -> $1 per M.
  EXPECT_NEAR(usd_per_million_tokens(1000, 1, 3.6), 1.0, 1e-12);
  EXPECT_EQ(usd_per_million_tokens(0, 8, 2.5), 0.0);
}

TEST(Cost, EnergyAndTotalCost) {
  // 8 x 700 W at PUE 1.25 = 7 kW; at 1400 tok/s that is 5 J per token.
  EXPECT_DOUBLE_EQ(facility_watts(8, 700, 1.25), 7000.0);
  EXPECT_DOUBLE_EQ(joules_per_token(1400, 8, 700, 1.25), 5.0);
  CostInputs in{8, 2.0, 700, 1.25, 0.10};
  CostBreakdown c = total_cost(in, 2 * kSecondsPerHour);
  EXPECT_DOUBLE_EQ(c.gpu_usd, 32.0);     // 8 GPUs x $2 x 2 h
  EXPECT_DOUBLE_EQ(c.energy_kwh, 14.0);  // 7 kW x 2 h
  EXPECT_NEAR(c.power_usd, 1.4, 1e-12);
  EXPECT_NEAR(c.total_usd, 33.4, 1e-12);
  // Per million tokens with power: ($16 + $0.70) per hour over 1000 tok/s x 3600 s.
  EXPECT_NEAR(usd_per_million_tokens(1000, in), 16.7 / 3.6, 1e-9);
  // Without an electricity price it equals the plain GPU-hour figure.
  in.usd_per_kwh = 0;
  EXPECT_NEAR(usd_per_million_tokens(1000, in), usd_per_million_tokens(1000, 8, 2.0), 1e-12);
}

}  // namespace
}  // namespace kiln::bench
