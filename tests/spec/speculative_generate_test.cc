// Speculative generation on the bundled models (models/README.md): kiln-tiny as the target,
// kiln-tiny-draft as the drafter. Greedy output must be token-for-token the target's own greedy
// output for every K, whatever the drafter proposes; sampled output must be reproducible.
#include "spec/speculative_generate.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "spec/draft_model_drafter.h"

namespace kiln::spec {
namespace {

std::string model_dir(const std::string& name) {
  return std::string(KILN_TEST_DATA) + "/../../models/" + name;
}

constexpr int64_t kNewTokens = 16;

struct Models {
  std::unique_ptr<ops::Backend> backend = ops::make_cpu_backend();
  std::unique_ptr<DeepseekV3Model> target = DeepseekV3Model::load(model_dir("kiln-tiny"), *backend);
  std::unique_ptr<DeepseekV3Model> draft = DeepseekV3Model::load(model_dir("kiln-tiny-draft"), *backend);
  std::vector<std::vector<int32_t>> prompts;  // the first two acceptance prompts of heldout.json, shortened
  Models() {
    std::ifstream f(model_dir("kiln-tiny") + "/heldout.json");
    const auto h = nlohmann::json::parse(f);
    for (size_t i = 0; i < 2; ++i) {
      auto ids = h["acceptance"]["prompt_ids"][i].get<std::vector<int32_t>>();
      ids.resize(std::min<size_t>(ids.size(), 24 + 8 * i));
      prompts.push_back(ids);
    }
  }
};

Models& models() {
  static Models m;
  return m;
}

// Plain greedy decoding from the target: prefill, then one token per step.
std::vector<int32_t> plain_greedy(DeepseekV3Model& model, const std::vector<int32_t>& prompt, int64_t n) {
  SequenceCache cache = model.new_cache(static_cast<int64_t>(prompt.size()) + n);
  std::vector<float> logits = model.forward(prompt, cache, false);
  std::vector<int32_t> out;
  const int64_t vocab = model.config().vocab_size;
  while (static_cast<int64_t>(out.size()) < n) {
    out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin()));
    if (static_cast<int64_t>(out.size()) < n) logits = model.forward({out.back()}, cache, false);
  }
  return out;
}

SpecGenerateOptions greedy_options(int64_t k) {
  SpecGenerateOptions o;
  o.num_draft_tokens = k, o.max_tokens = kNewTokens;
  o.sampling.temperature = 0;
  return o;
}

// Proposes a fixed script: the target's own continuation (all accepted) or tokens it never picks.
class ScriptedDrafter : public Drafter {
 public:
  ScriptedDrafter(std::vector<int32_t> prompt_and_answer, bool wrong, int64_t vocab)
      : script_(std::move(prompt_and_answer)), wrong_(wrong), vocab_(vocab) {}
  int64_t vocab_size() const override { return vocab_; }
  void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) override {
    out.num_seqs = 1, out.k = k, out.vocab = vocab_;
    out.tokens.assign(static_cast<size_t>(k), 0);
    out.probs.assign(static_cast<size_t>(k * vocab_), 0.0f);
    for (int64_t i = 0; i < k; ++i) {
      const size_t at = seqs[0].context.size() + static_cast<size_t>(i);
      const int32_t right = at < script_.size() ? script_[at] : 0;
      out.tokens[static_cast<size_t>(i)] = wrong_ ? (right + 1) % static_cast<int32_t>(vocab_) : right;
      out.probs[static_cast<size_t>(i * vocab_ + out.tokens[static_cast<size_t>(i)])] = 1.0f;
    }
  }
  void rollback(int64_t, int64_t keep) override { rollbacks.push_back(keep); }
  void release(int64_t) override {}
  std::vector<int64_t> rollbacks;

 private:
  std::vector<int32_t> script_;
  bool wrong_;
  int64_t vocab_;
};

TEST(SpeculativeGenerate, GreedyWithTheDraftModelIsTheTargetsGreedyOutputForEveryK) {
  Models& m = models();
  for (const auto& prompt : m.prompts) {
    const std::vector<int32_t> plain = plain_greedy(*m.target, prompt, kNewTokens);
    for (int64_t k = 1; k <= 4; ++k) {
      DraftModelDrafter drafter(*m.draft, 256);
      const SpecGenerateResult r = speculative_generate(*m.target, drafter, prompt, greedy_options(k));
      EXPECT_EQ(r.tokens, plain) << "K " << k << ", prompt of " << prompt.size();
      std::printf("K %lld, prompt of %zu: %lld verify steps for %lld tokens, mean accepted length %.2f\n",
                  static_cast<long long>(k), prompt.size(), static_cast<long long>(r.stats.steps),
                  static_cast<long long>(kNewTokens), r.stats.mean_accepted_length());
      EXPECT_LE(r.stats.accepted, r.stats.drafted);
      EXPECT_LT(r.stats.steps, kNewTokens - 1);  // the draft model predicts kiln-tiny often enough to save steps
      for (int64_t i = 1; i < k; ++i) EXPECT_LE(r.stats.accepted_at[i], r.stats.accepted_at[i - 1]);
    }
  }
}

TEST(SpeculativeGenerate, AllAcceptedAndAllRejectedDraftsLeaveTheOutputUnchanged) {
  Models& m = models();
  const std::vector<int32_t>& prompt = m.prompts[0];
  const std::vector<int32_t> plain = plain_greedy(*m.target, prompt, kNewTokens);
  std::vector<int32_t> script = prompt;
  script.insert(script.end(), plain.begin(), plain.end());
  for (int64_t k : {1, 4}) {
    ScriptedDrafter oracle(script, false, m.target->config().vocab_size);
    const SpecGenerateResult right = speculative_generate(*m.target, oracle, prompt, greedy_options(k));
    EXPECT_EQ(right.tokens, plain) << "K " << k;
    EXPECT_EQ(right.stats.accepted, right.stats.drafted);
    // k + 1 tokens per step after the prefill's first; the last step drafts only what is left.
    EXPECT_EQ(right.stats.steps, (kNewTokens - 1 + k) / (k + 1));

    ScriptedDrafter wrong(script, true, m.target->config().vocab_size);
    const SpecGenerateResult bad = speculative_generate(*m.target, wrong, prompt, greedy_options(k));
    EXPECT_EQ(bad.tokens, plain) << "K " << k;
    EXPECT_EQ(bad.stats.accepted, 0);
    EXPECT_EQ(bad.stats.steps, kNewTokens - 1);
    // Every step rolls the drafter back to the context it was given (nothing accepted).
    for (size_t i = 0; i < wrong.rollbacks.size(); ++i)
      EXPECT_EQ(wrong.rollbacks[i], static_cast<int64_t>(prompt.size() + 1 + i));
  }
}

TEST(SpeculativeGenerate, SampledOutputIsReproducibleFromTheSeed) {
  Models& m = models();
  SpecGenerateOptions o;
  o.num_draft_tokens = 3, o.max_tokens = kNewTokens;
  o.sampling.temperature = 0.8f, o.sampling.top_k = 40, o.sampling.top_p = 0.95f;
  o.sampling.seed = 1234;
  DraftModelDrafter d1(*m.draft, 256), d2(*m.draft, 256);
  const SpecGenerateResult a = speculative_generate(*m.target, d1, m.prompts[1], o);
  const SpecGenerateResult b = speculative_generate(*m.target, d2, m.prompts[1], o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(static_cast<int64_t>(a.tokens.size()), kNewTokens);
  EXPECT_GT(a.stats.accepted, 0);
  o.sampling.seed = 99;
  DraftModelDrafter d3(*m.draft, 256);
  EXPECT_NE(speculative_generate(*m.target, d3, m.prompts[1], o).tokens, a.tokens);
}

TEST(SpeculativeGenerate, StopsAtAStopToken) {
  Models& m = models();
  const std::vector<int32_t> plain = plain_greedy(*m.target, m.prompts[0], kNewTokens);
  SpecGenerateOptions o = greedy_options(4);
  o.sampling.stop_token_ids = {plain[5]};
  DraftModelDrafter drafter(*m.draft, 256);
  const SpecGenerateResult r = speculative_generate(*m.target, drafter, m.prompts[0], o);
  const auto first_stop = std::find(plain.begin(), plain.end(), plain[5]) - plain.begin();
  EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.begin(), plain.begin() + first_stop + 1));
}

TEST(SpeculativeGenerate, BadRequestsAreRefusedWithTheFaultNamed) {
  Models& m = models();
  DraftModelDrafter drafter(*m.draft, 256);
  const auto message = [&](const std::vector<int32_t>& prompt, const SpecGenerateOptions& o) {
    try {
      speculative_generate(*m.target, drafter, prompt, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({}, greedy_options(2)).find("prompt is empty"), std::string::npos);
  EXPECT_NE(message({1, 99999}, greedy_options(2)).find("prompt token 99999"), std::string::npos);
  EXPECT_NE(message({1, 2}, greedy_options(0)).find("number of draft tokens"), std::string::npos);
  SpecGenerateOptions pen = greedy_options(2);
  pen.sampling.repetition_penalty = 1.2f;
  EXPECT_NE(message({1, 2}, pen).find("penalties"), std::string::npos);
  DraftModelDrafter tiny_cache(*m.draft, 4);
  EXPECT_THROW(speculative_generate(*m.target, tiny_cache, m.prompts[0], greedy_options(2)), Error);
}

}  // namespace
}  // namespace kiln::spec
