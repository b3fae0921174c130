// The draft-model drafter on the bundled kiln-tiny-draft: what it proposes after a rollback must be
// what a fresh drafter proposes for the same context (its cache keeps only rows that are still
// true), its draft probabilities must be the transformed distribution its tokens came from, and
// its draws must follow the request's seed.
#include "spec/draft_model_drafter.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace kiln::spec {
namespace {

struct DraftModel {
  std::unique_ptr<ops::Backend> backend = ops::make_cpu_backend();
  std::unique_ptr<DeepseekV3Model> model =
      DeepseekV3Model::load(std::string(KILN_TEST_DATA) + "/../../models/kiln-tiny-draft", *backend);
};

DeepseekV3Model& draft_model() {
  static DraftModel m;
  return *m.model;
}

const std::vector<int32_t> kPrompt = {0, 3280, 759, 1356, 1142, 5219, 343, 880, 2347, 5955, 293, 720};

DraftOutput propose(Drafter& d, const std::vector<int32_t>& context, int64_t k, const SamplingParams& s,
                    uint64_t seed = 5) {
  const DraftInput in{0, context, &s, seed, context.size() - kPrompt.size()};
  DraftOutput out;
  d.propose(std::span<const DraftInput>(&in, 1), k, out);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

SamplingParams greedy() {
  SamplingParams s;
  s.temperature = 0;
  return s;
}

TEST(DraftModelDrafter, AfterARollbackItProposesWhatAFreshDrafterProposes) {
  SamplingParams sampled;
  sampled.temperature = 1.0f, sampled.top_k = 50;
  for (const SamplingParams& s : {greedy(), sampled}) {
    DraftModelDrafter reused(draft_model(), 128);
    const DraftOutput first = propose(reused, kPrompt, 4, s);
    // Two drafts accepted, then a token of the target's own.
    std::vector<int32_t> context = kPrompt;
    context.insert(context.end(), first.tokens.begin(), first.tokens.begin() + 2);
    context.push_back((first.tokens[2] + 1) % 8192);
    reused.rollback(0, static_cast<int64_t>(kPrompt.size()) + 2);
    for (int round = 0; round < 2; ++round) {
      const DraftOutput again = propose(reused, context, 3, s);
      DraftModelDrafter fresh(draft_model(), 128);
      const DraftOutput expected = propose(fresh, context, 3, s);
      EXPECT_EQ(again.tokens, expected.tokens) << "round " << round;
      EXPECT_LT(max_abs_diff(again.probs, expected.probs), 1e-4) << "round " << round;
      // Next round: every draft accepted plus a bonus token (the cache lacks the last draft's row).
      const int64_t before = static_cast<int64_t>(context.size());
      context.insert(context.end(), again.tokens.begin(), again.tokens.end());
      context.push_back(42);
      reused.rollback(0, before + 3);
    }
  }
}

TEST(DraftModelDrafter, ProbabilitiesAreTheDistributionTheTokensCameFrom) {
  SamplingParams s;
  s.temperature = 0.9f, s.top_k = 20, s.top_p = 0.9f;
  DraftModelDrafter d(draft_model(), 128);
  const DraftOutput out = propose(d, kPrompt, 3, s);
  ASSERT_EQ(out.tokens.size(), 3u);
  ASSERT_EQ(out.probs.size(), 3u * 8192u);
  for (int64_t i = 0; i < 3; ++i) {
    double total = 0;
    int64_t kept = 0;
    for (int64_t j = 0; j < 8192; ++j) total += out.probs[i * 8192 + j], kept += out.probs[i * 8192 + j] > 0;
    EXPECT_NEAR(total, 1.0, 1e-5);
    EXPECT_LE(kept, 20);  // top-k
    EXPECT_GT(out.probs[i * 8192 + out.tokens[i]], 0.0f);
  }
  // Greedy proposals carry one-hot probabilities at the token.
  DraftModelDrafter g(draft_model(), 128);
  const DraftOutput gout = propose(g, kPrompt, 2, greedy());
  for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(gout.probs[i * 8192 + gout.tokens[i]], 1.0f);
}

TEST(DraftModelDrafter, SampledProposalsFollowTheSeed) {
  SamplingParams s;
  s.temperature = 1.5f;  // flat enough that two seeds disagree somewhere
  std::vector<std::vector<int32_t>> by_seed;
  for (uint64_t seed : {1, 1, 2}) {
    DraftModelDrafter d(draft_model(), 128);
    by_seed.push_back(propose(d, kPrompt, 4, s, seed).tokens);
  }
  EXPECT_EQ(by_seed[0], by_seed[1]);
  EXPECT_NE(by_seed[0], by_seed[2]);
}

TEST(DraftModelDrafter, BadInputIsRefusedWithTheFaultNamed) {
  DraftModelDrafter d(draft_model(), 16);
  const SamplingParams s = greedy();
  const auto message = [&](const std::vector<int32_t>& context, int64_t k) {
    try {
      propose(d, context, k, s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}, 2).find("empty context"), std::string::npos);
  EXPECT_NE(message({1, 9000}, 2).find("token 9000"), std::string::npos);
  EXPECT_NE(message({1, 2}, 0).find("must be >= 1"), std::string::npos);
  EXPECT_NE(message(kPrompt, 6).find("over the draft cache"), std::string::npos);
  EXPECT_THROW(DraftModelDrafter(draft_model(), 1), Error);
  EXPECT_THROW(d.rollback(0, -1), Error);
}

}  // namespace
}  // namespace kiln::spec
