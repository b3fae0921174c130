// Speculative generation of one sequence on a DeepseekV3Model target with any Drafter: the
// reference loop the engine's batched speculation must agree with. The prompt's prefill gives
// the first token as plain sampling does; then each step drafts k tokens, runs the target once
// over the k + 1 positions [last token, drafts] and verifies exactly (spec/verifier.h). Rejected
// positions' KV is rolled back by shortening the cache: their rows get overwritten next step.
#pragma once

#include <span>
#include <vector>

#include "engine/sampling_params.h"
#include "model/deepseek_v3.h"
#include "spec/drafter.h"

namespace kiln::spec {

struct SpecGenerateOptions {
  int64_t num_draft_tokens = 4;  // K: drafts per step (fewer near max_tokens)
  int64_t max_tokens = 16;       // tokens to generate (fewer when a stop token comes)
  // temperature / top-k / top-p / min-p, seed and stop_token_ids are honoured; penalties are not
  // supported here yet and are refused.
  SamplingParams sampling;
};

struct SpecStats {
  int64_t steps = 0;                 // target verify forwards
  int64_t drafted = 0;               // draft tokens proposed
  int64_t accepted = 0;              // draft tokens accepted
  std::vector<int64_t> accepted_at;  // [K]: acceptances of draft position i
  std::vector<int64_t> proposed_at;  // [K]: proposals at draft position i
  // Tokens emitted per verify step (accepted drafts + the final token), the speculation's gain.
  double mean_accepted_length() const { return steps ? static_cast<double>(accepted + steps) / steps : 0.0; }
};

struct SpecGenerateResult {
  std::vector<int32_t> tokens;  // the generated tokens, without the prompt
  SpecStats stats;
};

SpecGenerateResult speculative_generate(DeepseekV3Model& target, Drafter& drafter, std::span<const int32_t> prompt,
                                        const SpecGenerateOptions& opt);

}  // namespace kiln::spec
