// Shared by the speculative sampling distribution tests: the target's next-token probabilities and
// a chi-square test of sampled (t0, t1) pairs against p(t0) p(t1 | t0).
#pragma once

#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "engine_spec_util.h"
#include "spec/verifier.h"

namespace kiln::spec {

// The target's distribution of the next token after `context` under `s`.
inline std::vector<float> next_probs(const std::vector<int32_t>& context, const SamplingParams& s) {
  DeepseekV3Model& m = *models().target;
  SequenceCache cache = m.new_cache(static_cast<int64_t>(context.size()) + 1);
  const std::vector<float> logits = m.forward(context, cache, false);
  std::vector<float> p(logits.size());
  sampling_probs_rows(logits.data(), 1, m.config().vocab_size, s, p.data());
  return p;
}

// p(t1 | t0 = a) after `prompt`, for each a of p0[a] > 0.
inline std::map<int32_t, std::vector<float>> second_probs(const std::vector<int32_t>& prompt,
                                                          const std::vector<float>& p0, const SamplingParams& s) {
  std::map<int32_t, std::vector<float>> p1;
  for (int32_t a = 0; a < static_cast<int32_t>(p0.size()); ++a) {
    if (p0[static_cast<size_t>(a)] <= 0) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(a);
    p1[a] = next_probs(ctx, s);
  }
  return p1;
}

// The chi-square quantile at 0.999 for `df` degrees of freedom (Wilson-Hilferty; within 1% here).
inline double chi2_999(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 3.0902 * std::sqrt(a), 3);
}

struct ChiSquare {
  double chi2 = 0;
  int cells = 0;  // pairs of nonzero probability
};

// Pearson's chi-square of the (t0, t1) pairs `got` starts with, `samples` of them, against
// samples * p0[a] * p1[a][b]; a pair of probability 0 must not occur.
inline ChiSquare pair_chi_square(const std::vector<std::vector<int32_t>>& got, int samples,
                                 const std::vector<float>& p0, const std::map<int32_t, std::vector<float>>& p1) {
  std::map<std::pair<int32_t, int32_t>, int> counts;
  for (const auto& t : got) ++counts[{t.at(0), t.at(1)}];
  ChiSquare r;
  for (const auto& [a, q] : p1)
    for (int32_t b = 0; b < static_cast<int32_t>(q.size()); ++b) {
      const double expected = samples * static_cast<double>(p0[static_cast<size_t>(a)]) * q[static_cast<size_t>(b)];
      const auto it = counts.find({a, b});
      const int observed = it == counts.end() ? 0 : it->second;
      if (expected <= 0) {
        EXPECT_EQ(observed, 0) << "pair " << a << " " << b << " has probability 0";
        continue;
      }
      r.chi2 += (observed - expected) * (observed - expected) / expected;
      ++r.cells;
    }
  return r;
}

// The verdict over top-p cells: several of them, and chi-square under its 0.999 quantile; prints
// it with how many of the `samples` drafts were `accepted`.
inline void expect_under_chi2_999(const ChiSquare& r, int samples, int64_t accepted) {
  ASSERT_GE(r.cells, 4) << "top-p must leave several cells";
  EXPECT_LT(r.chi2, chi2_999(r.cells - 1));
  std::printf("chi-square %.2f over %d cells (0.999 quantile %.1f), %d samples, %lld of %d drafts accepted\n", r.chi2,
              r.cells, chi2_999(r.cells - 1), samples, static_cast<long long>(accepted), samples);
}

}  // namespace kiln::spec
