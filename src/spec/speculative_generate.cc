#include "spec/speculative_generate.h"

#include <algorithm>

#include "core/error.h"
#include "spec/verifier.h"

namespace kiln::spec {
namespace {

constexpr int64_t kSeqId = 0;  // the one sequence this loop drives

// One verify over the target's logits [k + 1, vocab] for the single sequence; writes the
// emitted tokens to `out` [k + 1] and returns how many drafts were accepted.
int32_t verify_one(const std::vector<float>& logits, int64_t vocab, const SamplingParams& s, uint64_t seed,
                   uint64_t position, const int32_t* drafts, const float* draft_probs, int32_t k, int32_t* out) {
  std::vector<float> target(logits.size());
  sampling_probs_rows(logits.data(), k + 1, vocab, s, target.data());
  const uint8_t greedy = s.temperature <= 0.0f;
  int32_t accepted = 0;
  VerifyParams vp;
  vp.target_probs = target.data();
  vp.draft_probs = draft_probs;
  vp.draft_tokens = drafts;
  vp.num_draft = &k;
  vp.greedy = &greedy;
  vp.seeds = &seed;
  vp.positions = &position;
  vp.num_seqs = 1, vp.max_draft = k, vp.vocab = vocab;
  vp.out_tokens = out;
  vp.num_accepted = &accepted;
  verify(vp);
  return accepted;
}

}  // namespace

SpecGenerateResult speculative_generate(DeepseekV3Model& target, Drafter& drafter, std::span<const int32_t> prompt,
                                        const SpecGenerateOptions& opt) {
  const int64_t vocab = target.config().vocab_size, K = opt.num_draft_tokens;
  const SamplingParams& s = opt.sampling;
  s.validate(vocab);
  KILN_CHECK(K >= 1, "speculative decoding: the number of draft tokens must be >= 1, got {}", K);
  KILN_CHECK(opt.max_tokens >= 0, "speculative decoding: max_tokens must be >= 0, got {}", opt.max_tokens);
  KILN_CHECK(!prompt.empty(), "speculative decoding: the prompt is empty");
  KILN_CHECK(drafter.vocab_size() == vocab,
             "speculative decoding: the drafter's vocabulary ({}) is not the target's ({})", drafter.vocab_size(),
             vocab);
  KILN_CHECK(s.repetition_penalty == 1.0f && s.presence_penalty == 0.0f && s.frequency_penalty == 0.0f,
             "speculative decoding: repetition, presence and frequency penalties are not supported yet");
  for (int32_t t : prompt)
    KILN_CHECK(t >= 0 && t < vocab, "speculative decoding: prompt token {} is outside the vocabulary [0, {})", t,
               vocab);

  SpecGenerateResult r;
  r.stats.accepted_at.assign(static_cast<size_t>(K), 0);
  r.stats.proposed_at.assign(static_cast<size_t>(K), 0);
  if (opt.max_tokens == 0) return r;
  const uint64_t seed = s.seed.value_or(0);
  const auto stops = [&](int32_t t) {
    return std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), t) != s.stop_token_ids.end();
  };
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  SequenceCache cache = target.new_cache(n_prompt + opt.max_tokens + K + 1);
  std::vector<int32_t> context(prompt.begin(), prompt.end());

  // The first token comes from the prefill, exactly as plain generation draws it.
  int32_t first = 0;
  verify_one(target.forward(context, cache, /*all_logits=*/false), vocab, s, seed, 0, nullptr, nullptr, 0, &first);
  r.tokens.push_back(first);
  context.push_back(first);
  bool stopped = stops(first);

  DraftOutput draft;
  while (!stopped && static_cast<int64_t>(r.tokens.size()) < opt.max_tokens) {
    const int64_t remaining = opt.max_tokens - static_cast<int64_t>(r.tokens.size());
    const auto k = static_cast<int32_t>(std::min(K, remaining - 1));  // a step emits up to k + 1 tokens
    const uint64_t position = r.tokens.size();
    if (k > 0) {
      const DraftInput in{kSeqId, context, &s, seed, position};
      drafter.propose(std::span<const DraftInput>(&in, 1), k, draft);
    }
    // The target cache holds every committed token but the last; run it and the drafts.
    std::vector<int32_t> step{context.back()};
    step.insert(step.end(), draft.tokens.begin(), draft.tokens.begin() + (k > 0 ? k : 0));
    // The absorbed (decode) form over k + 1 queries: the numbers plain decoding computes per token.
    const std::vector<float> logits = target.forward(step, cache, /*all_logits=*/true, MlaForm::Absorbed);
    std::vector<int32_t> out(static_cast<size_t>(k) + 1);
    const int32_t a = verify_one(logits, vocab, s, seed, position, k > 0 ? draft.tokens.data() : nullptr,
                                 k > 0 ? draft.probs.data() : nullptr, k, out.data());
    cache.length -= k - a;  // rows of the rejected drafts
    drafter.rollback(kSeqId, static_cast<int64_t>(context.size()) + a);

    ++r.stats.steps;
    r.stats.drafted += k;
    r.stats.accepted += a;
    for (int32_t i = 0; i < k; ++i) {
      ++r.stats.proposed_at[static_cast<size_t>(i)];
      if (i < a) ++r.stats.accepted_at[static_cast<size_t>(i)];
    }
    for (int32_t i = 0; i <= a && !stopped; ++i) {
      r.tokens.push_back(out[static_cast<size_t>(i)]);
      context.push_back(out[static_cast<size_t>(i)]);
      stopped = stops(out[static_cast<size_t>(i)]);
    }
  }
  drafter.release(kSeqId);
  return r;
}

}  // namespace kiln::spec
