// Speculative decoding inside the engine (continuous batching) on the bundled models: kiln-tiny
// as the target, kiln-tiny-draft as the drafter. Whatever the batch, the pool or the prefix cache
// do, greedy output must be the engine's plain greedy output token for token; sampled output
// must follow the seed (engine_spec_distribution_test: and plain sampling's distribution).
#include "core/error.h"
#include "engine_spec_util.h"
#include "spec/paged_draft_drafter.h"

namespace kiln::spec {
namespace {

TEST(EngineSpec, GreedyOutputIsThePlainEnginesUnderContinuousBatching) {
  const std::vector<Request> reqs = mixed_requests();
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  for (int64_t k : {1, 3, 5}) {
    Engine spec(*models().target, config(k));
    EXPECT_EQ(run_all(spec, reqs), want) << "K " << k;
    const SpecDecodeStats s = spec.stats().spec;
    EXPECT_GT(s.verifies, 0);
    EXPECT_GT(s.accepted_tokens, 0) << "kiln-tiny-draft predicts kiln-tiny often";
    EXPECT_LE(s.accepted_tokens, s.draft_tokens);
    ASSERT_EQ(static_cast<int64_t>(s.proposed_at.size()), k);
    for (int64_t j = 1; j < k; ++j) EXPECT_LE(s.accepted_at[j], s.accepted_at[j - 1]);
    EXPECT_GT(s.mean_accepted_length(), 1.0);
    // Fewer steps than tokens: speculation saved target forwards.
    EXPECT_LT(spec.stats().decode_steps, plain.stats().decode_steps) << "K " << k;
  }
}

TEST(EngineSpec, VerifyRowsShareStepsWithPrefillChunks) {
  // Prompts go in 4 tokens per step: while the long ones are still prefilling, the short ones
  // already verify drafts in the same forward (absorbed verify rows beside expanded chunks).
  const std::vector<Request> reqs = mixed_requests();
  auto chunked = [](int64_t k) {
    EngineConfig c = config(k);
    c.scheduler.max_prefill_chunk = 4;
    return c;
  };
  Engine plain(*models().target, chunked(0));
  const auto want = run_all(plain, reqs);
  Engine spec(*models().target, chunked(3));
  EXPECT_EQ(run_all(spec, reqs), want);
  EXPECT_GT(spec.stats().spec.accepted_tokens, 0);
  EXPECT_GE(spec.stats().prefill_steps, 11);  // the 41-token prompt alone takes 11 steps
}

TEST(EngineSpec, PreemptionWithATinyPoolLosesNothing) {
  const std::vector<Request> reqs = mixed_requests();
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  Engine tight(*models().target, config(4, 4, 20));  // 80 tokens for ~200 wanted
  EXPECT_EQ(run_all(tight, reqs), want);
  EXPECT_GT(tight.stats().preemptions, 0);
  EXPECT_GT(tight.stats().spec.accepted_tokens, 0);
}

TEST(EngineSpec, PrefixCacheHitsGiveTheSameTokens) {
  // Requests after the first share its prompt and most of its output: their prefixes come from
  // blocks that verify steps published, which must hold only accepted tokens.
  const std::vector<int32_t>& base = models().prompts[4];
  Engine plain(*models().target, config(0));
  Engine spec(*models().target, config(3, 4));
  std::vector<int32_t> prompt = base;
  for (int round = 0; round < 3; ++round) {
    std::vector<Request> one;
    one.push_back(request(prompt, 20));
    const auto want = run_all(plain, one);
    const auto got = run_all(spec, one);
    EXPECT_EQ(got, want) << "round " << round;
    prompt.insert(prompt.end(), want[0].begin(), want[0].begin() + 15);  // the next prompt continues it
  }
  EXPECT_GT(spec.stats().prefix_hit_tokens, static_cast<int64_t>(base.size()));
}

TEST(EngineSpec, SampledOutputFollowsTheSeedWhateverIsBatched) {
  const std::vector<Request> reqs = sampled_mixed_requests();
  Engine spec(*models().target, config(3));
  const auto together = expect_alone_as_together(spec, reqs);
  // The first token comes from the prefill with plain sampling's own draw.
  Engine plain(*models().target, config(0));
  const auto base = run_all(plain, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(base[i][0], together[i][0]) << "request " << i;
}

TEST(EngineSpec, RequestsLongerThanTheDrafterCanTakeDecodePlainly) {
  // A drafter good for 30 positions: the 19-token request (5 + 14) speculates, the 48-token one
  // (32 + 16) does not, and both give the plain engine's tokens.
  auto draft = DeepseekV3Model::load(model_dir("kiln-tiny-draft"), *models().backend);
  EngineConfig c = config(0);
  c.speculator = std::make_shared<DrafterSpeculator>(std::make_unique<PagedDraftModelDrafter>(*draft, 64, 8), 3,
                                                     models().target->config().vocab_size, "draft", 30);
  std::vector<Request> reqs;
  reqs.push_back(request(models().prompts[3], 16));
  Engine plain(*models().target, config(0));
  Engine spec(*models().target, std::move(c));
  EXPECT_EQ(run_all(spec, reqs), run_all(plain, reqs));
  EXPECT_EQ(spec.stats().spec.verifies, 0);
  reqs[0] = request(models().prompts[0], 14);
  EXPECT_EQ(run_all(spec, reqs), run_all(plain, reqs));
  EXPECT_GT(spec.stats().spec.verifies, 0);
}

TEST(EngineSpec, WrongAlgorithmsAndCheckpointsAreRefusedByName) {
  // dspark wants a DeepSpec-format draft: a plain draft model's config lacks its fields.
  try {
    make_speculator("dspark", model_dir("kiln-tiny-draft"), 2, *models().target);
    FAIL() << "dspark took a plain draft model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_target_layers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_speculator("dspark", "", 2, *models().target), Error);
  EXPECT_THROW(make_speculator("draft", "", 2, *models().target), Error);
  EXPECT_THROW(make_speculator("draft", model_dir("kiln-tiny-draft"), 0, *models().target), Error);
  EXPECT_THROW(make_speculator("eagle", model_dir("kiln-tiny-draft"), 2, *models().target), Error);
}

}  // namespace
}  // namespace kiln::spec
