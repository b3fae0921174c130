// The DSpark block drafter in the engine (`--speculative-algorithm dspark`), on kiln-tiny with a
// random-weight draft of its shapes (dspark_util.h): greedy output is the plain engine's under
// continuous batching, chunked prefills, preemption and prefix-cache hits; DeepSpec's
// target_layer_ids map onto Kiln's taps; drafts that do not fit the target are refused by field.
// The drafts are accepted some of the time because the tests plant the target's own bigrams in
// the Markov head (see dspark_util.h), so the accept paths run too.
#include "core/error.h"
#include "dspark_util.h"
#include "engine_spec_util.h"
#include "spec/block_drafter_speculator.h"

namespace kiln::spec {
namespace {

struct DsparkSpec {
  std::shared_ptr<Speculator> speculator;
  BlockDrafter* drafter = nullptr;  // owned by speculator
};

DsparkSpec dspark_speculator(const std::string& dir, int64_t k) {
  DeepseekV3Model& target = *models().target;
  auto d = BlockDrafter::load(dir, target);
  DsparkSpec s;
  s.drafter = d.get();
  s.speculator = std::make_shared<DrafterSpeculator>(std::move(d), k, target.config().vocab_size, "dspark");
  return s;
}

EngineConfig dspark_config(const DsparkSpec& s, int64_t block_size = 8, int64_t num_blocks = 256) {
  EngineConfig c = config(0, block_size, num_blocks);
  c.speculator = s.speculator;
  return c;
}

// The plain engine's greedy outputs of `reqs`, and a draft planted with their bigrams.
std::string planted_draft(const std::vector<std::vector<int32_t>>& want) {
  return test::write_dspark_draft("engine", test::dspark_tiny_config(), test::bigrams(want, 16));
}

TEST(DsparkTaps, DeepSpecLayerIdsMapOntoKilnsTaps) {
  // DeepSpec's id i is HF's hidden_states[i + 1]: the residual after layer i, except the last
  // layer's, which HF returns after the final norm.
  EXPECT_EQ(block_drafter_taps({0, 2, 3}, 5, "t"), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(block_drafter_taps({1, 4}, 5, "t"), (std::vector<int32_t>{1, kHiddenFinalNorm}));
  try {
    block_drafter_taps({-1, 2}, 5, "t");
    ADD_FAILURE() << "the embedding output has no tap";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target_layer_ids[0] = -1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(block_drafter_taps({5}, 5, "t"), Error);
}

TEST(DsparkDrafter, GreedyOutputIsThePlainEnginesUnderContinuousBatching) {
  const std::vector<Request> reqs = mixed_requests();
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  const std::string dir = planted_draft(want);
  for (int64_t k : {1, 3, 4}) {
    DsparkSpec s = dspark_speculator(dir, k);
    EXPECT_EQ(s.speculator->hidden_taps(), (std::vector<int32_t>{1, kHiddenFinalNorm}));
    Engine spec(*models().target, dspark_config(s));
    EXPECT_EQ(run_all(spec, reqs), want) << "K " << k;
    const SpecDecodeStats st = spec.stats().spec;
    EXPECT_GT(st.verifies, 0) << "K " << k;
    EXPECT_GT(st.accepted_tokens, 0) << "K " << k;
    EXPECT_LT(st.accepted_tokens, st.draft_tokens) << "K " << k << ": some rejected, so rollback runs";
    EXPECT_EQ(s.drafter->rebuilt_positions(), 0) << "the engine handed over every hidden state";
    EXPECT_EQ(s.drafter->num_states(), 0) << "finished requests release their state";
  }
}

TEST(DsparkDrafter, ChunkedPrefillsAndPreemptionLoseNothing) {
  const std::vector<Request> reqs = mixed_requests();
  Engine plain(*models().target, config(0));
  const auto want = run_all(plain, reqs);
  const std::string dir = planted_draft(want);
  {
    DsparkSpec s = dspark_speculator(dir, 3);
    EngineConfig c = dspark_config(s);
    c.scheduler.max_prefill_chunk = 4;  // verify rows beside prompt chunks
    Engine spec(*models().target, std::move(c));
    EXPECT_EQ(run_all(spec, reqs), want);
    EXPECT_GT(spec.stats().spec.accepted_tokens, 0);
  }
  DsparkSpec s = dspark_speculator(dir, 4);
  Engine tight(*models().target, dspark_config(s, 4, 20));  // 80 tokens for ~200 wanted
  EXPECT_EQ(run_all(tight, reqs), want);
  EXPECT_GT(tight.stats().preemptions, 0);
  EXPECT_GT(tight.stats().spec.accepted_tokens, 0);
}

TEST(DsparkDrafter, PrefixCacheHitsAreRebuiltAndGiveTheSameTokens) {
  // Later requests continue the first one's prompt and output: their prefixes come from the prefix
  // cache, so the target never computes those hidden states; the drafter rebuilds them.
  const std::vector<int32_t>& base = models().prompts[4];
  Engine plain(*models().target, config(0));
  std::vector<std::vector<int32_t>> prompts{base}, wants;
  for (int round = 0; round < 3; ++round) {
    std::vector<Request> one;
    one.push_back(request(prompts.back(), 20));
    wants.push_back(run_all(plain, one)[0]);
    std::vector<int32_t> next = prompts.back();
    next.insert(next.end(), wants.back().begin(), wants.back().begin() + 15);
    prompts.push_back(next);
  }
  DsparkSpec s = dspark_speculator(planted_draft(wants), 3);
  Engine spec(*models().target, dspark_config(s, 4));
  for (int round = 0; round < 3; ++round) {
    std::vector<Request> one;
    one.push_back(request(prompts[static_cast<size_t>(round)], 20));
    EXPECT_EQ(run_all(spec, one)[0], wants[static_cast<size_t>(round)]) << "round " << round;
  }
  EXPECT_GT(spec.stats().prefix_hit_tokens, static_cast<int64_t>(base.size()));
  EXPECT_GT(s.drafter->rebuilt_positions(), 0);
  EXPECT_GT(spec.stats().spec.accepted_tokens, 0);
}

TEST(DsparkDrafter, SampledOutputFollowsTheSeedWhateverIsBatched) {
  const std::vector<Request> reqs = sampled_mixed_requests();
  DsparkSpec s = dspark_speculator(test::write_dspark_draft("sampled", test::dspark_tiny_config()), 3);
  Engine spec(*models().target, dspark_config(s));
  const auto together = expect_alone_as_together(spec, reqs);
}

TEST(DsparkDrafter, ExposesTheConfidenceHeadsEstimates) {
  DsparkSpec s = dspark_speculator(test::write_dspark_draft("confidence", test::dspark_tiny_config()), 2);
  const std::vector<int32_t>& prompt = models().prompts[1];
  SamplingParams greedy;
  greedy.temperature = 0;
  DraftInput in{7, prompt, &greedy, 0, 0};
  DraftOutput out;
  s.drafter->propose({&in, 1}, 2, out);  // no hidden states handed over: all rebuilt
  EXPECT_EQ(s.drafter->rebuilt_positions(), static_cast<int64_t>(prompt.size()) - 1);
  EXPECT_EQ(s.drafter->context_length(7), static_cast<int64_t>(prompt.size()) - 1);
  const std::vector<float> c = s.drafter->confidence(7);
  ASSERT_EQ(c.size(), 4u);
  for (float x : c) EXPECT_TRUE(x > 0 && x < 1) << x;
  s.drafter->rollback(7, 2);
  EXPECT_EQ(s.drafter->context_length(7), 2);
  s.drafter->release(7);
  EXPECT_TRUE(s.drafter->confidence(7).empty());
}

// make_speculator loads `j` as a dspark draft for kiln-tiny; the error must name `field`.
void expect_refused(nlohmann::json j, const std::string& field, int64_t k = 2) {
  const std::string dir = test::write_dspark_draft("refused", j);
  try {
    make_speculator("dspark", dir, k, *models().target);
    ADD_FAILURE() << "accepted a draft with a bad " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(DsparkDrafter, RefusesADraftThatDoesNotFitTheTarget) {
  nlohmann::json j = test::dspark_tiny_config();
  auto s = make_speculator("dspark", test::write_dspark_draft("fits", j), 4, *models().target);
  EXPECT_STREQ(s->name(), "dspark");
  expect_refused(j, "block_size", 5);
  j["hidden_size"] = 128;
  expect_refused(j, "hidden_size");
  j = test::dspark_tiny_config(), j["vocab_size"] = 4096, j["mask_token_id"] = 4095;
  expect_refused(j, "vocab_size");
  j = test::dspark_tiny_config(), j["num_target_layers"] = 6;
  expect_refused(j, "num_target_layers");
  j = test::dspark_tiny_config(), j["target_layer_ids"] = {-1, 2};
  expect_refused(j, "target_layer_ids[0] = -1");
}

}  // namespace
}  // namespace kiln::spec
