// Token choice from one row of logits: the engine's per-sequence face of the sample op
// (ops/params.h SampleParams, reference in ops/cpu/sampling.h). The pipeline per row:
// log-probabilities of the raw logits (what logprobs report, as the OpenAI API and vLLM do), then
// penalties, then greedy argmax or a draw from the distribution after temperature, top-k, top-p
// and min-p (each renormalising what it keeps). Draw n of a request uses the counter-based uniform
// sample_uniform(seed, n) (ops/sampling_rng.h), so its tokens depend on its seed and position only:
// not on batching, preemption or the backend.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace kiln {

// Index of the largest value; the lowest index wins ties (as torch.argmax).
int32_t argmax(const float* logits, int64_t n);

// log-probabilities of a row (f32 with a max shift, f64 sum).
std::vector<float> log_softmax_row(const float* logits, int64_t n);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0;              // of `token` under the raw model distribution
  std::vector<TokenLogprob> top;  // [top_logprobs]: most likely first, lowest id on ties
};

// A sequence's penalty entries in the sample op's CSR form: the distinct tokens of prompt and
// output (prompt ones only when the repetition penalty is on) with their counts in the output;
// empty when the request's penalties are all off.
struct PenaltyTokens {
  std::vector<int32_t> ids;     // [n] distinct
  std::vector<int32_t> counts;  // [n] occurrences in the output (0: prompt only)
};
PenaltyTokens penalty_tokens(const SamplingParams& p, std::span<const int32_t> prompt, std::span<const int32_t> output);

// Repetition, presence and frequency penalties on `logits` [vocab], in place.
void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output);

// The distribution a draw comes from, [n]: one-hot at the argmax when greedy, else after
// temperature, top-k, top-p and min-p, renormalised. Penalties are the caller's (apply_penalties).
std::vector<double> sampling_probs(const float* logits, int64_t n, const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), seed_(p.seed.value_or(0)) {}

  // Draws from sampling_probs(logits) (no penalties) with the sampler's own running counter
  // (0, 1, 2, ...): repeated draws from one distribution. No draw is made when greedy.
  int32_t sample(const float* logits, int64_t n);
  // The full pipeline for a sequence's next token (the sample op on one row): logprobs, penalties
  // over its tokens, draw number output.size().
  SampleResult sample(std::span<const float> logits, std::span<const int32_t> prompt, std::span<const int32_t> output);
  std::vector<double> probs(const float* logits, int64_t n) const { return sampling_probs(logits, n, p_); }
  const SamplingParams& params() const { return p_; }
  uint64_t seed() const { return seed_; }

 private:
  SamplingParams p_;
  uint64_t seed_;
  uint64_t counter_ = 0;  // draws made by sample(logits, n)
};

}  // namespace kiln
