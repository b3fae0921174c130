// The exact verifier's rules, case by case (spec/verifier.h); the distribution it produces is
// checked statistically in verifier_distribution_test.cc.
#include "spec/verifier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "engine/sampler.h"

namespace kiln::spec {
namespace {

// One sequence's inputs with its k drafts, probabilities given directly.
struct OneSeq {
  int64_t vocab = 4;
  std::vector<float> p;  // [k + 1, vocab]
  std::vector<float> q;  // [k, vocab]
  std::vector<int32_t> drafts;
  int32_t k = 0;
  uint8_t greedy = 0;
  uint64_t seed = 7, position = 0;
  std::vector<int32_t> out;
  int32_t accepted = -1;

  VerifyParams params() {
    k = static_cast<int32_t>(drafts.size());
    out.assign(static_cast<size_t>(k) + 1, -1);
    VerifyParams v;
    v.target_probs = p.data();
    v.draft_probs = q.empty() ? nullptr : q.data();
    v.draft_tokens = drafts.empty() ? nullptr : drafts.data();
    v.num_draft = &k;
    v.greedy = &greedy;
    v.seeds = &seed;
    v.positions = &position;
    v.num_seqs = 1, v.max_draft = k, v.vocab = vocab;
    v.out_tokens = out.data();
    v.num_accepted = &accepted;
    return v;
  }
  void run() { verify(params()); }
};

TEST(Verifier, GreedyAcceptsWhileDraftIsTheArgmaxThenEmitsTheArgmax) {
  OneSeq s;
  s.greedy = 1;
  // argmax per position: 2, 1, 3, 0
  s.p = {0, 0, 1, 0, /**/ 0, 1, 0, 0, /**/ 0, 0, 0, 1, /**/ 1, 0, 0, 0};
  s.drafts = {2, 1, 0};
  s.run();
  EXPECT_EQ(s.accepted, 2);
  EXPECT_EQ((std::vector<int32_t>{s.out[0], s.out[1], s.out[2]}), (std::vector<int32_t>{2, 1, 3}));
  s.drafts = {2, 1, 3};
  s.run();
  EXPECT_EQ(s.accepted, 3);
  EXPECT_EQ(s.out, (std::vector<int32_t>{2, 1, 3, 0}));  // the bonus token from p_{k+1}
  s.drafts = {0, 1, 3};
  s.run();
  EXPECT_EQ(s.accepted, 0);
  EXPECT_EQ(s.out[0], 2);
}

TEST(Verifier, GreedyNeedsNoDraftProbabilities) {
  OneSeq s;
  s.greedy = 1;
  s.p = {0.1f, 0.7f, 0.1f, 0.1f, 0.4f, 0.3f, 0.2f, 0.1f};  // not one-hot: the argmax still decides
  s.drafts = {1};
  s.run();
  EXPECT_EQ(s.accepted, 1);
  EXPECT_EQ(s.out, (std::vector<int32_t>{1, 0}));
}

TEST(Verifier, DraftTheTargetLikesAtLeastAsMuchIsAlwaysAccepted) {
  // p(x) >= q(x) passes u * q(x) < p(x) for every u in [0, 1).
  for (uint64_t seed = 0; seed < 200; ++seed) {
    OneSeq s;
    s.seed = seed;
    s.p = {0.1f, 0.6f, 0.2f, 0.1f, 0.25f, 0.25f, 0.25f, 0.25f, 0.7f, 0.1f, 0.1f, 0.1f};
    s.q = {0.4f, 0.5f, 0.05f, 0.05f, 0.1f, 0.1f, 0.5f, 0.3f};
    s.drafts = {1, 0};
    s.run();
    ASSERT_EQ(s.accepted, 2) << seed;
    EXPECT_EQ(s.out[0], 1);
    EXPECT_EQ(s.out[1], 0);
  }
}

TEST(Verifier, DraftTheTargetExcludesIsAlwaysRejectedAndTheResidualAvoidsIt) {
  // Token 3 is outside the target's support (as after top-k); the residual max(p - q, 0) here is
  // (0.3, 0, 0.2, 0) / 0.5, so token 1 (where q covers p) is never drawn either.
  int counts[4] = {0, 0, 0, 0};
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    OneSeq s;
    s.seed = seed;
    s.p = {0.5f, 0.2f, 0.3f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f};
    s.q = {0.2f, 0.3f, 0.1f, 0.4f};
    s.drafts = {3};
    s.run();
    ASSERT_EQ(s.accepted, 0);
    ++counts[s.out[0]];
  }
  EXPECT_EQ(counts[1], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_NEAR(counts[0] / 2000.0, 0.6, 0.05);
  EXPECT_NEAR(counts[2] / 2000.0, 0.4, 0.05);
}

TEST(Verifier, WithoutDraftsItIsPlainSamplingWithTheSameUniform) {
  // k = 0 draws the token at output position n with sample_uniform(seed, n), as the sampler does.
  const std::vector<float> logits = {0.3f, -1.2f, 2.0f, 0.9f, 1.4f, -0.2f, 0.0f, 1.1f};
  SamplingParams sp;
  sp.temperature = 0.8f, sp.top_k = 6, sp.top_p = 0.9f;
  int same = 0;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    sp.seed = seed;
    OneSeq s;
    s.vocab = 8, s.seed = seed, s.position = 5;
    s.p.resize(8);
    sampling_probs_rows(logits.data(), 1, 8, sp, s.p.data());
    s.run();
    EXPECT_EQ(s.accepted, 0);
    const std::vector<int32_t> earlier(5, 1);  // five tokens already out: this is draw number 5
    same += s.out[0] == Sampler(sp).sample(logits, std::vector<int32_t>{}, earlier).token;
  }
  EXPECT_EQ(same, 500);
}

TEST(Verifier, SameSeedSameTokensAndRowsOfABatchAreIndependent) {
  // Two sequences in one call give what each gives alone.
  const int64_t V = 4, K = 2;
  std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f, 0.25f, 0.25f, 0.25f, 0.25f,
                          0.7f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f, 0.7f, 0.1f, 0.0f,  0.5f,  0.5f,  0.0f};
  std::vector<float> q = {0.4f, 0.3f, 0.2f, 0.1f, 0.1f,  0.2f,  0.3f,  0.4f,
                          0.1f, 0.7f, 0.1f, 0.1f, 0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<int32_t> drafts = {0, 3, 1, 2}, num = {2, 1};
  std::vector<uint8_t> greedy = {0, 0};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<uint64_t> seeds = {seed, seed + 1000}, positions = {3, 9};
    std::vector<int32_t> out(2 * (K + 1), -1), acc(2, -1);
    verify({p.data(), q.data(), drafts.data(), num.data(), greedy.data(), seeds.data(), positions.data(), 2, K, V,
            out.data(), acc.data()});
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<int32_t> out1(K + 1, -1);
      int32_t acc1 = -1;
      verify({p.data() + r * (K + 1) * V, q.data() + r * K * V, drafts.data() + r * K, &num[r], &greedy[r], &seeds[r],
              &positions[r], 1, K, V, out1.data(), &acc1});
      ASSERT_EQ(acc[r], acc1);
      for (int32_t i = 0; i <= acc1; ++i) ASSERT_EQ(out[r * (K + 1) + i], out1[i]);
    }
  }
}

TEST(Verifier, ABatchMixesGreedySampledAndNonSpeculatingRows) {
  // Row 0 greedy with 2 drafts (no draft probabilities read), row 1 sampled without drafts (plain
  // sampling), row 2 sampled with 2 drafts the target agrees with at least as much (all accepted).
  const int64_t V = 3, K = 2;
  std::vector<float> p = {0,    1,    0, 1,    0,    0, 0,    0,    1,   // greedy: argmax 1, 0, 2
                          0,    0,    1, 0.5f, 0.5f, 0, 0.5f, 0.5f, 0,   // only its first row is read
                          0.2f, 0.8f, 0, 0.9f, 0.1f, 0, 0,    0,    1};  // bonus row: token 2 for sure
  std::vector<float> q(3 * K * V, 0.0f);  // row 2 drafted 1 then 0 from q = p there (always accepted)
  std::copy_n(p.begin() + 2 * (K + 1) * V, K * V, q.begin() + 2 * K * V);
  std::vector<int32_t> drafts = {1, 2, 0, 0, 1, 0}, num = {2, 0, 2}, out(3 * (K + 1), -1), acc(3, -1);
  std::vector<uint8_t> greedy = {1, 0, 0};
  std::vector<uint64_t> seeds = {1, 2, 3}, positions = {0, 0, 0};
  verify({p.data(), q.data(), drafts.data(), num.data(), greedy.data(), seeds.data(), positions.data(), 3, K, V,
          out.data(), acc.data()});
  EXPECT_EQ(acc, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(out[0], 1);  // accepted
  EXPECT_EQ(out[1], 0);  // the argmax where draft 2 disagreed
  EXPECT_EQ(out[3], 2);  // row 1: the only token its distribution allows
  EXPECT_EQ((std::vector<int32_t>{out[6], out[7], out[8]}), (std::vector<int32_t>{1, 0, 2}));
}

TEST(Verifier, BadInputIsRefusedWithTheFaultNamed) {
  const auto error_of = [](OneSeq s) {
    try {
      s.run();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  OneSeq good;
  good.p = {0.5f, 0.5f, 0, 0, 0.25f, 0.25f, 0.25f, 0.25f};
  good.q = {0.5f, 0.5f, 0, 0};
  good.drafts = {1};
  EXPECT_EQ(error_of(good), "no error");
  OneSeq s = good;
  s.drafts = {4};
  EXPECT_NE(error_of(s).find("draft token 4"), std::string::npos);
  s = good;
  s.drafts = {2};  // q(2) = 0: the drafter could not have drawn it
  EXPECT_NE(error_of(s).find("draft probability 0"), std::string::npos);
  s = good;
  s.p[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(error_of(s).find("target_probs of sequence 0 position 1"), std::string::npos);
  s = good;
  s.q = {0, 0, 0, 0};
  EXPECT_NE(error_of(s).find("sums to zero"), std::string::npos);
  s = good;
  s.q.clear();
  EXPECT_NE(error_of(s).find("draft_probs is null"), std::string::npos);

  OneSeq g = good;
  VerifyParams v = g.params();
  int32_t too_many = 2;
  v.num_draft = &too_many;
  EXPECT_THROW(verify(v), Error);
  v = g.params();
  v.vocab = 0;
  EXPECT_THROW(verify(v), Error);
  v = g.params();
  v.seeds = nullptr;
  EXPECT_THROW(verify(v), Error);
}

TEST(Verifier, DrawWeightedWalksIdsInOrder) {
  const std::vector<float> w = {0, 1, 0, 3};
  EXPECT_EQ(draw_weighted(w.data(), 4, 0.0), 1);
  EXPECT_EQ(draw_weighted(w.data(), 4, 0.2499), 1);
  EXPECT_EQ(draw_weighted(w.data(), 4, 0.25), 3);
  EXPECT_EQ(draw_weighted(w.data(), 4, 0.9999), 3);
  const std::vector<float> zero = {0, 0};
  EXPECT_THROW(draw_weighted(zero.data(), 2, 0.5), Error);
}

}  // namespace
}  // namespace kiln::spec
