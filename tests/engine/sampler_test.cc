#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "engine/stop.h"

namespace kiln {
namespace {

SamplingParams params(float temperature, int64_t top_k, float top_p, float min_p, uint64_t seed = 0) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

TEST(Sampler, ArgmaxTakesLowestIndexOnTies) {
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(argmax(l.data(), 4), 1);
}

TEST(Sampler, ProbsApplyTopKTopPAndMinP) {
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto p = Sampler(params(1, 2, 1, 0)).probs(l.data(), 4);
  EXPECT_NEAR(p[0], 0.625, 1e-6);
  EXPECT_NEAR(p[1], 0.375, 1e-6);
  EXPECT_EQ(p[2], 0.0);
  auto q = Sampler(params(1, 0, 0.9f, 0)).probs(l.data(), 4);  // 0.5 + 0.3 + 0.15 reaches 0.9
  EXPECT_NEAR(q[2], 0.15 / 0.95, 1e-6);
  EXPECT_EQ(q[3], 0.0);
  // Top-p after top-k works on the renormalised top-k mass: 0.625 alone is below 0.7.
  auto kp = Sampler(params(1, 3, 0.7f, 0)).probs(l.data(), 4);
  EXPECT_NEAR(kp[0], 0.625, 1e-6);
  EXPECT_NEAR(kp[1], 0.375, 1e-6);
  // min-p 0.35 keeps tokens with at least 0.35 x 0.5.
  auto m = Sampler(params(1, 0, 1, 0.35f)).probs(l.data(), 4);
  EXPECT_NEAR(m[0], 0.625, 1e-6);
  EXPECT_EQ(m[2], 0.0);
  auto g = Sampler(params(0, 0, 1, 0)).probs(l.data(), 4);
  EXPECT_EQ(g[0], 1.0);
}

// Draws follow the renormalised distribution: chi-square over the kept tokens against a bound
// with p < 0.001 for their degrees of freedom; dropped tokens are never drawn.
void expect_draws_follow(const SamplingParams& sp, const std::vector<float>& l) {
  Sampler s(sp);
  const int64_t n = static_cast<int64_t>(l.size());
  auto p = s.probs(l.data(), n);
  const int draws = 40000;
  std::map<int, int> count;
  for (int i = 0; i < draws; ++i) ++count[s.sample(l.data(), n)];
  double chi2 = 0;
  int kept = 0;
  for (int k = 0; k < n; ++k) {
    if (p[static_cast<size_t>(k)] == 0) {
      EXPECT_EQ(count[k], 0) << "token " << k << " was dropped but drawn";
      continue;
    }
    ++kept;
    const double expect = p[static_cast<size_t>(k)] * draws;
    chi2 += (count[k] - expect) * (count[k] - expect) / expect;
  }
  // 99.9% quantiles of chi-square with 1..7 degrees of freedom.
  const double bound[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
  ASSERT_GE(kept, 2);
  EXPECT_LT(chi2, bound[kept - 1]) << "kept " << kept;
}

TEST(Sampler, DrawsFollowTopK) {
  expect_draws_follow(params(0.8f, 4, 1, 0, 42), {1.0f, 0.5f, 0.0f, -0.5f, -3.0f, 0.2f});
}

TEST(Sampler, DrawsFollowTopP) {
  expect_draws_follow(params(1, 0, 0.8f, 0, 7), {1.0f, 0.5f, 0.0f, -0.5f, -3.0f, 0.2f, -1.0f});
}

TEST(Sampler, DrawsFollowMinP) {
  expect_draws_follow(params(1.3f, 0, 1, 0.2f, 9), {1.0f, 0.5f, 0.0f, -0.5f, -3.0f, 0.2f, -1.0f});
}

TEST(Sampler, DrawsFollowAllTogether) {
  expect_draws_follow(params(0.7f, 5, 0.95f, 0.05f, 3), {1.0f, 0.9f, 0.0f, -0.5f, -3.0f, 0.2f, -1.0f});
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> l = {0.3f, 0.2f, 0.1f, 0.0f};
  Sampler a(params(1, 0, 1, 0, 7)), b(params(1, 0, 1, 0, 7)), c(params(1, 0, 1, 0, 8));
  int differ = 0;
  for (int i = 0; i < 100; ++i) {
    const int32_t x = a.sample(l.data(), 4);
    EXPECT_EQ(x, b.sample(l.data(), 4));
    differ += x != c.sample(l.data(), 4);
  }
  EXPECT_GT(differ, 0);
}

// The full pipeline draws with counter = tokens generated so far: a recomputed (preempted)
// sequence redraws the same token, whatever was sampled before.
TEST(Sampler, DrawDependsOnSeedAndPositionOnly) {
  std::vector<float> l = {0.3f, 0.2f, 0.1f, 0.0f, -0.2f};
  SamplingParams p = params(1, 0, 1, 0, 99);
  Sampler a(p), b(p);
  const std::vector<int32_t> prompt = {1, 2}, out3 = {0, 1, 2};
  for (int i = 0; i < 5; ++i) a.sample(l, prompt, {});  // history must not matter
  EXPECT_EQ(a.sample(l, prompt, out3).token, b.sample(l, prompt, out3).token);
  int differ = 0;
  std::vector<int32_t> out;
  for (int i = 0; i < 50; ++i) {
    const int32_t t = b.sample(l, prompt, out).token;
    differ += t != a.sample(l, prompt, out).token;
    out.push_back(t);
  }
  EXPECT_EQ(differ, 0);
  std::map<int32_t, int> seen;
  for (int32_t t : out) ++seen[t];
  EXPECT_GT(seen.size(), 2u);  // the position moves the draw
}

TEST(Sampler, PenaltiesFollowOpenAIAndHF) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  const std::vector<int32_t> prompt = {0, 1}, output = {2, 2, 1};
  apply_penalties(l, p, prompt, output);
  EXPECT_FLOAT_EQ(l[0], 1.0f);                     // prompt: 2 / 2
  EXPECT_FLOAT_EQ(l[1], -4.0f - 0.25f - 0.5f);     // both: -2 * 2, then once in the output
  EXPECT_FLOAT_EQ(l[2], 0.5f - 2 * 0.25f - 0.5f);  // output twice
  EXPECT_FLOAT_EQ(l[3], 0.5f);                     // untouched
}

TEST(Sampler, LogprobsComeFromTheRawDistribution) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 10.0f;  // pushes token 1 down for the choice, not for the logprobs
  p.logprobs = true;
  p.top_logprobs = 2;
  Sampler s(p);
  const std::vector<int32_t> prompt = {1};
  SampleResult r = s.sample(l, prompt, {});
  EXPECT_EQ(r.token, 3);
  auto lp = log_softmax_row(l.data(), 4);
  EXPECT_FLOAT_EQ(r.logprob, lp[3]);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 1);  // ties: lowest id first
  EXPECT_EQ(r.top[1].token, 3);
}

// logit_bias moves the choice (greedy and drawn) but not the logprobs, which stay the raw row's.
TEST(Sampler, LogitBiasMovesTheChoiceNotTheLogprobs) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.0f};
  const auto lp = log_softmax_row(l.data(), 4);
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 2;
  EXPECT_EQ(Sampler(p).sample(l, {}, {}).token, 1);
  p.logit_bias = {{1, -100.0f}, {3, 2.5f}};  // 1 banned; 3 lifted to 2.5, above 2's 2.0
  SampleResult r = Sampler(p).sample(l, {}, {});
  EXPECT_EQ(r.token, 3);
  EXPECT_FLOAT_EQ(r.logprob, lp[3]);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 1);  // the raw model's most likely, banned or not
  EXPECT_FLOAT_EQ(r.top[0].logprob, lp[1]);
  EXPECT_EQ(r.top[1].token, 2);
  // A draw: +100 on one token makes it the only one with any mass, whatever the seed.
  p.temperature = 1;
  p.logit_bias = {{0, 100.0f}};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    EXPECT_EQ(Sampler(p).sample(l, {}, {}).token, 0);
  }
  // Bias before penalties (vLLM's order): the biased logit 1 + 9 = 10 is divided by 10 -> 1.
  p.temperature = 0;
  p.logit_bias = {{0, 9.0f}};
  p.repetition_penalty = 10.0f;
  const std::vector<int32_t> prompt = {0};
  EXPECT_EQ(Sampler(p).sample(l, prompt, {}).token, 1);
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  try {
    p.validate(10);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  SamplingParams q;
  q.stop_token_ids = {10};
  EXPECT_THROW(q.validate(10), Error);
  SamplingParams b;
  b.logit_bias = {{10, 1.0f}};
  EXPECT_THROW(b.validate(10), Error);
  b.logit_bias = {{2, 101.0f}};
  EXPECT_THROW(b.validate(10), Error);
  b.logit_bias = {{3, 1.0f}, {2, 1.0f}};
  EXPECT_THROW(b.validate(10), Error);
  SamplingParams ok;
  ok.logit_bias = {{0, -100.0f}, {9, 100.0f}};
  EXPECT_NO_THROW(ok.validate(10));
}

TEST(StopStrings, MatchAcrossPiecesAndHoldBackPrefixes) {
  StopStringMatcher m({"END", "xy"});
  EXPECT_EQ(m.feed("hello E"), "hello ");  // "E" might start "END"
  EXPECT_EQ(m.feed("N"), "");
  EXPECT_EQ(m.feed("Dtail"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_string(), "END");
  EXPECT_EQ(m.feed("more"), "");

  StopStringMatcher n({"END"});
  EXPECT_EQ(n.feed("EN"), "");
  EXPECT_EQ(n.feed("d"), "ENd");  // not a stop after all
  EXPECT_EQ(n.feed("xE"), "x");
  EXPECT_EQ(n.flush(), "E");
  EXPECT_FALSE(n.matched());

  StopStringMatcher earliest({"bc", "ab"});
  EXPECT_EQ(earliest.feed("zabc"), "z");
  EXPECT_EQ(earliest.matched_string(), "ab");

  StopStringMatcher none;
  EXPECT_EQ(none.feed("abc"), "abc");
}

}  // namespace
}  // namespace kiln
