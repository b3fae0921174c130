// Speculative decoding inside the engine (continuous batching) on the bundled models: kiln-tiny
// as the target, kiln-tiny-draft as the drafter. Whatever the batch, the pool or the prefix cache
// do, greedy output must be the engine's plain greedy output token for token; sampled output
// must follow the seed and, in distribution, plain sampling.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>

#include "core/error.h"
#include "engine/engine.h"
#include "spec/engine_speculator.h"
#include "spec/verifier.h"
#include "test_util.h"

namespace kiln::spec {
namespace {

std::string model_dir(const std::string& name) {
  return (test::repo_root() / "models" / name).string();
}

struct Models {
  std::unique_ptr<ops::Backend> backend = ops::make_cpu_backend();
  std::unique_ptr<DeepseekV3Model> target = DeepseekV3Model::load(model_dir("kiln-tiny"), *backend);
  std::vector<std::vector<int32_t>> prompts;  // heldout acceptance prompts of different lengths
  Models() {
    std::ifstream f(model_dir("kiln-tiny") + "/heldout.json");
    const auto h = nlohmann::json::parse(f);
    for (size_t i = 0; i < 5; ++i) {
      auto ids = h["acceptance"]["prompt_ids"][i].get<std::vector<int32_t>>();
      ids.resize(std::min<size_t>(ids.size(), 5 + 9 * i));
      prompts.push_back(ids);
    }
  }
};

Models& models() {
  static Models m;
  return m;
}

EngineConfig config(int64_t k, int64_t block_size = 8, int64_t num_blocks = 256) {
  EngineConfig c;
  c.block_size = block_size;
  c.kv.num_blocks = num_blocks;
  c.check_invariants = true;
  if (k > 0) c.speculator = make_speculator("draft", model_dir("kiln-tiny-draft"), k, *models().target);
  return c;
}

Request request(const std::vector<int32_t>& prompt, int64_t max_tokens, float temperature = 0, uint64_t seed = 1) {
  Request r;
  r.prompt = prompt;
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.seed = seed;
  return r;
}

Request clone(const Request& r) {
  Request c;
  c.prompt = r.prompt;
  c.sampling = r.sampling;
  c.speculate = r.speculate;
  return c;
}

// Submits all at once (one continuous batch) and returns each request's tokens.
std::vector<std::vector<int32_t>> run_all(Engine& e, const std::vector<Request>& reqs) {
  std::vector<RequestStream> streams;
  for (const auto& r : reqs) streams.push_back(e.submit(clone(r)));
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    OutputChunk all;
    while (auto c = s.next()) all.merge(std::move(*c));
    EXPECT_EQ(all.error, "");
    EXPECT_EQ(static_cast<int64_t>(all.token_ids.size()), all.output_tokens);
    out.push_back(all.token_ids);
  }
  return out;
}

// Several prompts of different lengths and lengths to generate; one (the third) plainly decoded.
std::vector<Request> mixed_requests() {
  std::vector<Request> reqs;
  for (size_t i = 0; i < models().prompts.size(); ++i) {
    reqs.push_back(request(models().prompts[i], 7 + 5 * static_cast<int64_t>(i)));
    reqs.back().speculate = i != 2;
  }
  return reqs;
}

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
  std::vector<Request> reqs = mixed_requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampling.temperature = 0.8f, reqs[i].sampling.top_k = 40, reqs[i].sampling.top_p = 0.95f;
    reqs[i].sampling.seed = 100 + i;
  }
  Engine spec(*models().target, config(3));
  const auto together = run_all(spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<Request> alone;
    alone.push_back(clone(reqs[i]));
    EXPECT_EQ(run_all(spec, alone)[0], together[i]) << "request " << i;
  }
  // The first token comes from the prefill with plain sampling's own draw.
  Engine plain(*models().target, config(0));
  const auto base = run_all(plain, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(base[i][0], together[i][0]) << "request " << i;
}

// The target's distribution of the next token (top_k 4 at temperature 1) after `context`.
std::vector<float> next_probs(const std::vector<int32_t>& context, const SamplingParams& s) {
  DeepseekV3Model& m = *models().target;
  SequenceCache cache = m.new_cache(static_cast<int64_t>(context.size()) + 1);
  const std::vector<float> logits = m.forward(context, cache, false);
  std::vector<float> p(logits.size());
  sampling_probs_rows(logits.data(), 1, m.config().vocab_size, s, p.data());
  return p;
}

TEST(EngineSpec, SampledPairsFollowPlainSamplingsDistribution) {
  // max_tokens 3: the prefill draws t0 as plain sampling does, then one verify step over one
  // draft emits t1 (the accepted draft or the residual draw). (t0, t1) must be distributed as
  // p(t0) p(t1 | t0) of the target: 16 cells under top_k 4.
  constexpr int kSamples = 800;
  const std::vector<int32_t>& prompt = models().prompts[1];
  SamplingParams s;
  s.temperature = 1.0f, s.top_k = 4;
  std::vector<Request> reqs;
  for (int i = 0; i < kSamples; ++i) {
    reqs.push_back(request(prompt, 3, 1.0f, 7000 + static_cast<uint64_t>(i)));
    reqs.back().sampling.top_k = 4;
  }
  Engine spec(*models().target, config(1, 8, 2048));
  const auto got = run_all(spec, reqs);
  EXPECT_EQ(spec.stats().spec.verifies, kSamples);
  EXPECT_GT(spec.stats().spec.accepted_tokens, 0);
  EXPECT_LT(spec.stats().spec.accepted_tokens, kSamples) << "some drafts must be rejected for the test to bite";

  std::map<std::pair<int32_t, int32_t>, int> counts;
  for (const auto& t : got) ++counts[{t.at(0), t.at(1)}];
  const std::vector<float> p0 = next_probs(prompt, s);
  double chi2 = 0;
  int cells = 0;
  for (int32_t a = 0; a < static_cast<int32_t>(p0.size()); ++a) {
    if (p0[static_cast<size_t>(a)] <= 0) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.push_back(a);
    const std::vector<float> p1 = next_probs(ctx, s);
    for (int32_t b = 0; b < static_cast<int32_t>(p1.size()); ++b) {
      const double expected = kSamples * static_cast<double>(p0[static_cast<size_t>(a)]) * p1[static_cast<size_t>(b)];
      const auto it = counts.find({a, b});
      const int observed = it == counts.end() ? 0 : it->second;
      if (expected <= 0) {
        EXPECT_EQ(observed, 0) << "pair " << a << " " << b << " has probability 0";
        continue;
      }
      chi2 += (observed - expected) * (observed - expected) / expected;
      ++cells;
    }
  }
  ASSERT_EQ(cells, 16);
  // 15 degrees of freedom: P(chi2 > 37.7) = 0.001 under the null.
  EXPECT_LT(chi2, 37.7);
  std::printf("chi-square %.2f over %d cells, %d samples\n", chi2, cells, kSamples);
}

TEST(EngineSpec, AlgorithmsNotBuiltAreRefusedByName) {
  for (const char* a : {"mtp", "dspark"}) {
    try {
      make_speculator(a, model_dir("kiln-tiny-draft"), 2, *models().target);
      FAIL() << a;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not built yet"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(make_speculator("draft", "", 2, *models().target), Error);
  EXPECT_THROW(make_speculator("draft", model_dir("kiln-tiny-draft"), 0, *models().target), Error);
  EXPECT_THROW(make_speculator("eagle", model_dir("kiln-tiny-draft"), 2, *models().target), Error);
}

}  // namespace
}  // namespace kiln::spec
