// Speculation must not change what is sampled (DESIGN.md §6). Toy first-order Markov models over a
// 12-token vocabulary stand in for target and drafter (the drafter deliberately different); a
// speculative loop with k = 3 drafts per step generates two tokens per trial under temperature 1
// with top-k and top-p, and a chi-square test compares the first token, and the pair, with the
// target's own distribution. The same test must fail on a verifier with an off-by-one (draft i
// checked against p_{i+1}) and on one that resamples from p_i instead of the residual at a
// rejection (it emits only tokens the target allows, so only the counts can tell), which shows the
// test can see such bugs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "ops/sampling_rng.h"
#include "spec/verifier.h"

namespace kiln::spec {
namespace {

constexpr int64_t kVocab = 12;
constexpr int32_t kDrafts = 3;
constexpr int64_t kTrials = 120000;

// next-token probabilities after each token, after the sampling transform: [vocab, vocab]
struct MarkovModel {
  std::vector<float> probs;
  const float* after(int32_t prev) const { return probs.data() + prev * kVocab; }
};

MarkovModel random_model(uint32_t seed, const SamplingParams& s) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(static_cast<size_t>(kVocab * kVocab));
  for (float& l : logits) l = normal(gen);
  MarkovModel m;
  m.probs.resize(logits.size());
  sampling_probs_rows(logits.data(), kVocab, kVocab, s, m.probs.data());
  return m;
}

SamplingParams sampled() {
  SamplingParams s;
  s.temperature = 1.0f, s.top_k = 8, s.top_p = 0.9f;
  return s;
}

enum class Verifier {
  Exact,               // spec::verify
  OffByOne,            // spec::verify fed p_{i+1} where p_i belongs
  ResampleFromTarget,  // a broken copy below: a rejection draws from p_i, not from max(p_i - q_i, 0)
};

int32_t verify_resampling_from_target(const float* p, const float* q, const int32_t* drafts, uint64_t seed,
                                      uint64_t position, int32_t* out) {
  for (int32_t i = 0; i < kDrafts; ++i) {
    const float *pi = p + i * kVocab, *qi = q + i * kVocab;
    if (ops::sample_uniform(seed, (position + i) | kAcceptStream) * qi[drafts[i]] < pi[drafts[i]]) {
      out[i] = drafts[i];
      continue;
    }
    out[i] = draw_weighted(pi, kVocab, ops::sample_uniform(seed, position + i));
    return i;
  }
  out[kDrafts] = draw_weighted(p + kDrafts * kVocab, kVocab, ops::sample_uniform(seed, position + kDrafts));
  return kDrafts;
}

// The first two tokens after token 0 for one seed.
std::pair<int32_t, int32_t> speculate_two(const MarkovModel& target, const MarkovModel& draft, uint64_t seed,
                                          Verifier verifier) {
  std::vector<int32_t> emitted;
  int32_t last = 0;
  while (emitted.size() < 2) {
    const uint64_t position = emitted.size();
    std::vector<int32_t> drafts(kDrafts);
    std::vector<float> q(kDrafts * kVocab), p((kDrafts + 2) * kVocab);
    int32_t prev = last;
    for (int32_t i = 0; i < kDrafts; ++i) {
      std::copy_n(draft.after(prev), kVocab, q.begin() + i * kVocab);
      drafts[i] = draw_weighted(draft.after(prev), kVocab, ops::sample_uniform(seed, (position + i) | kDraftStream));
      prev = drafts[i];
    }
    // The target scores last, x_1..x_k: p_1 after last, p_{i+1} after x_i (and one spare row).
    std::copy_n(target.after(last), kVocab, p.begin());
    for (int32_t i = 0; i <= kDrafts; ++i)
      std::copy_n(target.after(drafts[std::min(i, kDrafts - 1)]), kVocab, p.begin() + (i + 1) * kVocab);
    const uint8_t greedy = 0;
    int32_t k = kDrafts, accepted = -1;
    std::vector<int32_t> out(kDrafts + 1);
    if (verifier == Verifier::ResampleFromTarget) {
      accepted = verify_resampling_from_target(p.data(), q.data(), drafts.data(), seed, position, out.data());
    } else {
      const int64_t shift = verifier == Verifier::OffByOne ? kVocab : 0;
      verify({p.data() + shift, q.data(), drafts.data(), &k, &greedy, &seed, &position, 1, kDrafts, kVocab, out.data(),
              &accepted});
    }
    for (int32_t i = 0; i <= accepted; ++i) emitted.push_back(out[i]);
    last = emitted.back();
  }
  return {emitted[0], emitted[1]};
}

// Pearson's statistic over cells with their expected counts; cells expected below 5 are pooled.
// A cell with probability 0 that was observed makes the statistic infinite.
struct ChiSquare {
  double statistic = 0;
  int64_t df = 0;
};
ChiSquare chi_square(const std::vector<double>& probs, const std::vector<int64_t>& counts, int64_t n) {
  ChiSquare c;
  double pooled_e = 0, pooled_o = 0;
  int64_t cells = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n), o = static_cast<double>(counts[i]);
    if (probs[i] == 0 && counts[i] > 0) c.statistic = std::numeric_limits<double>::infinity();
    if (probs[i] == 0) continue;
    if (e < 5) {
      pooled_e += e, pooled_o += o;
      continue;
    }
    c.statistic += (o - e) * (o - e) / e, ++cells;
  }
  if (pooled_e > 0) c.statistic += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++cells;
  c.df = cells - 1;
  return c;
}

// The chi-square quantile at 1 - 1e-5 (Wilson-Hilferty): a correct verifier fails it once in
// 100,000 seeds sets; the seeds are fixed, so the outcome is too.
double critical_value(int64_t df) {
  const double z = 4.265, d = static_cast<double>(df), a = 2.0 / (9.0 * d);
  return d * std::pow(1 - a + z * std::sqrt(a), 3);
}

struct Outcome {
  ChiSquare first, pair;
};

Outcome run_trials(Verifier verifier) {
  const MarkovModel target = random_model(1, sampled()), draft = random_model(2, sampled());
  std::vector<int64_t> first(kVocab, 0), pair(kVocab * kVocab, 0);
  for (int64_t t = 0; t < kTrials; ++t) {
    const auto [a, b] = speculate_two(target, draft, 1000003 * static_cast<uint64_t>(t) + 17, verifier);
    ++first[a];
    ++pair[a * kVocab + b];
  }
  std::vector<double> p_first(kVocab), p_pair(kVocab * kVocab);
  for (int64_t a = 0; a < kVocab; ++a) {
    p_first[a] = target.after(0)[a];
    for (int64_t b = 0; b < kVocab; ++b) p_pair[a * kVocab + b] = p_first[a] * target.after(static_cast<int32_t>(a))[b];
  }
  const Outcome o{chi_square(p_first, first, kTrials), chi_square(p_pair, pair, kTrials)};
  std::printf(
      "verifier %d: first token chi2 %.1f (df %lld, critical %.1f), pair chi2 %.1f (df %lld, "
      "critical %.1f)\n",
      static_cast<int>(verifier), o.first.statistic, static_cast<long long>(o.first.df), critical_value(o.first.df),
      o.pair.statistic, static_cast<long long>(o.pair.df), critical_value(o.pair.df));
  return o;
}

TEST(VerifierDistribution, ToyModelsDifferEnoughToMatter) {
  // The test has teeth only if the drafter's proposals get rejected often.
  const MarkovModel target = random_model(1, sampled()), draft = random_model(2, sampled());
  double overlap = 0;  // acceptance probability of the first draft: sum min(p, q)
  for (int64_t j = 0; j < kVocab; ++j) overlap += std::min(target.after(0)[j], draft.after(0)[j]);
  EXPECT_LT(overlap, 0.8);
  EXPECT_GT(overlap, 0.1);
}

TEST(VerifierDistribution, SpeculativeSamplesFollowTheTarget) {
  const Outcome o = run_trials(Verifier::Exact);
  EXPECT_LT(o.first.statistic, critical_value(o.first.df)) << "df " << o.first.df;
  EXPECT_LT(o.pair.statistic, critical_value(o.pair.df)) << "df " << o.pair.df;
  EXPECT_GE(o.pair.df, 20);
}

TEST(VerifierDistribution, AnOffByOneVerifierFailsTheTest) {
  const Outcome o = run_trials(Verifier::OffByOne);
  EXPECT_GT(o.first.statistic, critical_value(o.first.df)) << "df " << o.first.df;
  EXPECT_GT(o.pair.statistic, critical_value(o.pair.df)) << "df " << o.pair.df;
}

TEST(VerifierDistribution, ResamplingFromTheTargetAtARejectionFailsTheTest) {
  const Outcome o = run_trials(Verifier::ResampleFromTarget);
  EXPECT_TRUE(std::isfinite(o.pair.statistic));  // every token it emits is one the target allows
  EXPECT_GT(o.first.statistic, critical_value(o.first.df)) << "df " << o.first.df;
  EXPECT_GT(o.pair.statistic, critical_value(o.pair.df)) << "df " << o.pair.df;
}

}  // namespace
}  // namespace kiln::spec
