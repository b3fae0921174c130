#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace kiln {
namespace {

TEST(Sampler, ArgmaxTakesLowestIndexOnTies) {
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(argmax(l.data(), 4), 1);
}

TEST(Sampler, ProbsApplyTopKAndTopP) {
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto p = Sampler({1.0f, 2, 1.0f, 0}).probs(l.data(), 4);
  EXPECT_NEAR(p[0], 0.625, 1e-6);
  EXPECT_NEAR(p[1], 0.375, 1e-6);
  EXPECT_EQ(p[2], 0.0);
  auto q = Sampler({1.0f, 0, 0.9f, 0}).probs(l.data(), 4);  // 0.5 + 0.3 + 0.15 reaches 0.9
  EXPECT_NEAR(q[2], 0.15 / 0.95, 1e-6);
  EXPECT_EQ(q[3], 0.0);
}

// Draws follow the renormalised distribution (chi-square, 3 degrees of freedom, p < 0.001 bound).
TEST(Sampler, DrawsFollowTheDistribution) {
  std::vector<float> l = {1.0f, 0.5f, 0.0f, -0.5f, -3.0f};
  Sampler s({0.8f, 4, 1.0f, 42});
  auto p = s.probs(l.data(), 5);
  const int n = 40000;
  std::map<int, int> count;
  for (int i = 0; i < n; ++i) ++count[s.sample(l.data(), 5)];
  EXPECT_EQ(count[4], 0);  // outside the top 4
  double chi2 = 0;
  for (int k = 0; k < 4; ++k) {
    double expect = p[static_cast<size_t>(k)] * n;
    chi2 += (count[k] - expect) * (count[k] - expect) / expect;
  }
  EXPECT_LT(chi2, 16.27);
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> l = {0.3f, 0.2f, 0.1f, 0.0f};
  Sampler a({1.0f, 0, 1.0f, 7}), b({1.0f, 0, 1.0f, 7});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(l.data(), 4), b.sample(l.data(), 4));
}

}  // namespace
}  // namespace kiln
