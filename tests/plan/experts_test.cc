// The expected number of distinct experts a batch touches, against a simulation of random top-k
// routing (each token picks k distinct experts uniformly).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "plan/planner.h"

namespace kiln::plan {
namespace {

double simulate(int64_t experts, int64_t k, int64_t tokens, int trials, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, experts - 1);
  std::vector<char> hit(static_cast<size_t>(experts));
  std::vector<int64_t> chosen;
  double sum = 0;
  for (int t = 0; t < trials; ++t) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int64_t b = 0; b < tokens; ++b) {
      // k distinct experts, uniformly: draw, and draw again on a repeat within this token.
      chosen.clear();
      while (static_cast<int64_t>(chosen.size()) < k) {
        const int64_t e = pick(rng);
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int64_t e : chosen) hit[static_cast<size_t>(e)] = 1;
    }
    sum += static_cast<double>(std::count(hit.begin(), hit.end(), 1));
  }
  return sum / trials;
}

TEST(DistinctExperts, MatchesSimulationWithinOnePercent) {
  struct Case {
    int64_t experts, k, tokens;
  };
  // DeepSeek-V3, Kimi K2, Moonlight, the Kimi K3 preset; batches from 1 to past saturation.
  const Case cases[] = {{256, 8, 1},   {256, 8, 4},    {256, 8, 16},   {256, 8, 64},  {384, 8, 2},
                        {384, 8, 32},  {384, 8, 128},  {64, 6, 3},     {64, 6, 10},   {64, 6, 40},
                        {1056, 8, 16}, {1056, 8, 100}, {1056, 8, 512}, {384, 8, 1024}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "E=" << c.experts << " k=" << c.k << " B=" << c.tokens);
    const double formula = expected_distinct_experts(c.experts, c.k, static_cast<double>(c.tokens));
    const double sim = simulate(c.experts, c.k, c.tokens, 2000, seed++);
    EXPECT_NEAR(sim, formula, 0.01 * formula);
  }
}

TEST(DistinctExperts, Limits) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(256, 8, 1), 8.0);  // one token: exactly its k
  EXPECT_NEAR(expected_distinct_experts(256, 8, 100000), 256.0, 1e-9);
  EXPECT_EQ(expected_distinct_experts(256, 8, 0), 0.0);
  EXPECT_EQ(expected_distinct_experts(0, 8, 10), 0.0);
  // More tokens never touch fewer experts, and never more than B * k.
  double prev = 0;
  for (int b = 1; b < 300; ++b) {
    double d = expected_distinct_experts(384, 8, b);
    EXPECT_GE(d, prev);
    EXPECT_LE(d, 8.0 * b + 1e-9);
    prev = d;
  }
}

}  // namespace
}  // namespace kiln::plan
