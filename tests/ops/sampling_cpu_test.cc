// The sample op's CPU reference: the counter-based uniform, the cuts against a brute-force
// definition, ties, penalties, logprobs, seeded reproducibility and the empirical distribution of
// many draws. CPU only (runs in CI); tests/ops/sampling_parity_test.cc holds the CUDA one to it.
#include <gtest/gtest.h>

#include <map>

#include "ops/cpu/sampling.h"
#include "ops/sampling_rng.h"
#include "sampling_util.h"

namespace kiln::test {
namespace {

ops::Backend& cpu() {
  return *backends().cpu;
}

TEST(SampleRng, PhiloxMatchesRandom123KnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const ops::Philox4x32 r =
        ops::philox4x32_10(ops::Philox4x32{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << i;
  }
}

TEST(SampleRng, UniformIsInRangeAndUnbiased) {
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = ops::sample_uniform(42, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);  // fixed seed: deterministic
  EXPECT_EQ(ops::sample_uniform(7, 3), ops::sample_uniform(7, 3));
  EXPECT_NE(ops::sample_uniform(7, 3), ops::sample_uniform(8, 3));
  EXPECT_NE(ops::sample_uniform(7, 3), ops::sample_uniform(7, 4));
}

// Per-row mode mix covering greedy, each cut alone and together.
void set_mode(SampleBatch& b, int64_t r, int mode) {
  const auto i = static_cast<size_t>(r);
  switch (mode % 7) {
    case 0: b.temperature[i] = 0; break;
    case 1: b.temperature[i] = 0.7f; break;
    case 2: b.top_k[i] = 1 + static_cast<int32_t>(r % 5); break;
    case 3: b.top_p[i] = 0.3f + 0.1f * static_cast<float>(r % 7); break;
    case 4: b.min_p[i] = 0.05f + 0.1f * static_cast<float>(r % 4); break;
    case 5: b.temperature[i] = 1.3f, b.top_k[i] = 4, b.top_p[i] = 0.8f, b.min_p[i] = 0.1f; break;
    default: b.temperature[i] = 0.5f, b.top_k[i] = 1000000, b.top_p[i] = 0.95f; break;
  }
}

TEST(SampleCpu, MatchesTheBruteForceDefinition) {
  int checked = 0;
  for (int64_t vocab : {1, 2, 7, 50, 1000}) {
    for (float quantum : {0.0f, 0.5f}) {
      SampleBatch b;
      b.resize(64, vocab, 5);
      fill_logits(b, static_cast<uint64_t>(vocab * 10 + (quantum > 0)), 2.0f, quantum);
      for (int64_t r = 0; r < b.rows; ++r) {
        set_mode(b, r, static_cast<int>(r));
        b.seed[static_cast<size_t>(r)] = 100 + static_cast<uint64_t>(r);
        b.counter[static_cast<size_t>(r)] = static_cast<uint64_t>(r * 3);
      }
      const SampleOut o = run_sample(cpu(), b);
      EXPECT_EQ(o.logits_after, b.logits);
      for (int64_t r = 0; r < b.rows; ++r) {
        const auto i = static_cast<size_t>(r);
        const float* l = b.row(r);
        const BruteKept k = brute_kept(l, vocab, b.temperature[i], b.top_k[i], b.top_p[i], b.min_p[i]);
        const int32_t want = brute_draw(k, ops::sample_uniform(b.seed[i], b.counter[i]));
        EXPECT_EQ(o.token[i], want) << "vocab " << vocab << " row " << r;
        // The kept set and its weights, through the row function.
        if (b.temperature[i] > 0) {
          const ops::cpu::KeptTokens kt =
              ops::cpu::kept_tokens(l, vocab, {b.temperature[i], b.top_k[i], b.top_p[i], b.min_p[i]});
          EXPECT_EQ(kt.ids, k.ids) << "vocab " << vocab << " row " << r;
        }
        double lse = 0;
        const float mx = *std::max_element(l, l + vocab);
        for (int64_t j = 0; j < vocab; ++j) lse += std::exp(static_cast<double>(l[j]) - mx);
        lse = mx + std::log(lse);
        EXPECT_NEAR(o.logprob[i], l[want] - lse, 1e-5);
        std::vector<int32_t> order(static_cast<size_t>(vocab));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [l](int32_t a, int32_t c) { return l[a] > l[c]; });
        for (int64_t j = 0; j < b.num_top; ++j) {
          const auto at = static_cast<size_t>(r * b.num_top + j);
          if (j < vocab) {
            EXPECT_EQ(o.top_ids[at], order[static_cast<size_t>(j)]);
            EXPECT_NEAR(o.top_lp[at], l[order[static_cast<size_t>(j)]] - lse, 1e-5);
          } else {
            EXPECT_EQ(o.top_ids[at], -1);
            EXPECT_EQ(o.top_lp[at], -INFINITY);
          }
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 5 * 2 * 64);
}

TEST(SampleCpu, TiesCutLowestIdsFirst) {
  SampleBatch b;
  b.resize(6, 10, 3);
  for (auto& x : b.logits) x = 1.0f;
  for (int64_t j = 0; j < 10; ++j) b.row(5)[j] = j == 0 ? -0.0f : 0.0f;  // -0 == +0: a tie
  b.temperature = {0, 1, 1, 1, 1, 1};
  b.top_k = {0, 3, 0, 0, 0, 2};
  b.top_p = {1, 1, 0.35f, 1, 1, 1};
  b.min_p = {0, 0, 0, 1, 0, 0};
  int zero_drawn = 0;
  for (uint64_t c = 0; c < 200; ++c) {
    b.counter.assign(6, c);
    b.seed.assign(6, 5);
    const SampleOut o = run_sample(cpu(), b);
    EXPECT_EQ(o.token[0], 0);  // greedy: lowest id
    EXPECT_LT(o.token[1], 3);  // top-k 3 of 10 equal: ids 0..2
    EXPECT_LT(o.token[2], 4);  // top-p 0.35 of 10 equal: 4 tokens reach it
    EXPECT_LT(o.token[5], 2);  // ids 0 (-0) and 1
    zero_drawn += o.token[5] == 0;
    EXPECT_EQ(o.top_ids[0], 0);
    EXPECT_EQ(o.top_ids[1], 1);
    EXPECT_EQ(o.top_ids[2], 2);
  }
  EXPECT_GT(zero_drawn, 50);
}

TEST(SampleCpu, PenaltiesFromTheCsrListsAndRawLogprobs) {
  SampleBatch b;
  b.resize(3, 4, 2);
  const float l[4] = {3.0f, 2.9f, 0.0f, 2.8f};
  for (int64_t r = 0; r < 3; ++r) std::copy(l, l + 4, b.row(r));
  b.temperature.assign(3, 0.0f);
  b.repetition = {2.0f, 1.0f, 1.0f};  // row 0: token 0 in the prompt -> 1.5; argmax moves to 1
  b.presence = {0.0f, 0.5f, 0.0f};    // row 1: tokens 0 (x1) and 1 (x0: prompt only)
  b.frequency = {0.0f, 0.25f, 0.0f};  // 3 - 0.25 - 0.5 = 2.25 < 2.9: argmax 1
  b.pen_offsets = {0, 1, 3, 4};
  b.pen_ids = {0, 0, 1, 0};
  b.pen_counts = {0, 1, 0, 5};  // row 2: penalties off, entries ignored
  const SampleOut o = run_sample(cpu(), b);
  EXPECT_EQ(o.token, (std::vector<int32_t>{1, 1, 0}));
  const double lse = std::log(std::exp(3.0) + std::exp(2.9) + 1.0 + std::exp(2.8));
  EXPECT_NEAR(o.logprob[0], 2.9 - lse, 1e-6);  // raw distribution, not the penalised one
  EXPECT_EQ(o.top_ids[0], 0);
  EXPECT_EQ(o.top_ids[1], 1);
  // Exactly the CPU row function's arithmetic (what the CUDA kernel repeats without FMA).
  float x[4] = {2.0f, -2.0f, 1.0f, 0.5f};
  const int32_t ids[3] = {0, 1, 2}, counts[3] = {0, 1, 2};
  ops::cpu::apply_penalties_row(x, ids, counts, 3, 2.0f, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(x[0], 1.0f);
  EXPECT_FLOAT_EQ(x[1], -4.0f - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(x[2], 0.5f - 2 * 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(x[3], 0.5f);
}

TEST(SampleCpu, TokenDependsOnSeedAndCounterOnlyNotTheBatch) {
  SampleBatch alone;
  alone.resize(1, 1000, 0);
  fill_logits(alone, 3, 1.5f, 0);
  alone.temperature[0] = 0.9f, alone.top_p[0] = 0.9f, alone.seed[0] = 77;
  SampleBatch crowd;
  crowd.resize(8, 1000, 0);
  fill_logits(crowd, 4, 1.5f, 0);
  std::copy(alone.logits.begin(), alone.logits.end(), crowd.row(5));
  crowd.temperature[5] = 0.9f, crowd.top_p[5] = 0.9f, crowd.seed[5] = 77;
  int differ = 0;
  int32_t prev = -1;
  for (uint64_t c = 0; c < 50; ++c) {
    alone.counter[0] = c;
    crowd.counter.assign(8, c * 31 + 1);
    crowd.counter[5] = c;
    const int32_t t = run_sample(cpu(), alone).token[0];
    EXPECT_EQ(run_sample(cpu(), crowd).token[5], t);
    EXPECT_EQ(run_sample(cpu(), alone).token[0], t);  // and again: reproducible
    differ += prev >= 0 && t != prev;
    prev = t;
  }
  EXPECT_GT(differ, 10);  // the counter moves the draw
}

// Many draws (counter 0..N-1, fixed seed: deterministic) follow the renormalised distribution:
// chi-square over the kept tokens below its 99.9% quantile; dropped tokens never appear.
void expect_draws_follow(float temp, int32_t top_k, float top_p, float min_p, const std::vector<float>& l) {
  const int64_t n = static_cast<int64_t>(l.size()), draws = 40000;
  SampleBatch b;
  b.resize(draws, n, 0);
  for (int64_t r = 0; r < draws; ++r) {
    std::copy(l.begin(), l.end(), b.row(r));
    const auto i = static_cast<size_t>(r);
    b.temperature[i] = temp, b.top_k[i] = top_k, b.top_p[i] = top_p, b.min_p[i] = min_p;
    b.seed[i] = 2024, b.counter[i] = static_cast<uint64_t>(r);
  }
  const SampleOut o = run_sample(cpu(), b);
  const BruteKept k = brute_kept(l.data(), n, temp, top_k, top_p, min_p);
  std::map<int32_t, int> count;
  for (int32_t t : o.token) ++count[t];
  double total = 0, chi2 = 0;
  for (double w : k.w) total += w;
  for (size_t j = 0; j < k.ids.size(); ++j) {
    const double expect = k.w[j] / total * static_cast<double>(draws);
    chi2 += (count[k.ids[j]] - expect) * (count[k.ids[j]] - expect) / expect;
    count.erase(k.ids[j]);
  }
  EXPECT_TRUE(count.empty()) << "a dropped token was drawn";
  const double bound[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88};
  ASSERT_GE(k.ids.size(), 2u);
  ASSERT_LE(k.ids.size(), 10u);
  EXPECT_LT(chi2, bound[k.ids.size() - 1]) << "kept " << k.ids.size();
}

TEST(SampleCpu, DrawsFollowTheRenormalisedDistribution) {
  const std::vector<float> l = {1.0f, 0.5f, 0.0f, -0.5f, -3.0f, 0.2f, -1.0f, 0.9f};
  expect_draws_follow(1.0f, 0, 1.0f, 0.0f, l);
  expect_draws_follow(0.8f, 4, 1.0f, 0.0f, l);
  expect_draws_follow(1.0f, 0, 0.8f, 0.0f, l);
  expect_draws_follow(1.3f, 0, 1.0f, 0.2f, l);
  expect_draws_follow(0.7f, 6, 0.95f, 0.05f, l);
}

}  // namespace
}  // namespace kiln::test
