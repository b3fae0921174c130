// Token choice from one row of logits. The pipeline per row: log-probabilities of the raw logits
// (what logprobs report, as the OpenAI API and vLLM do), then penalties, then greedy argmax or a
// draw from the distribution after temperature, top-k, top-p and min-p (each renormalising what it
// keeps), using the request's own seeded generator.
#pragma once

#include <cstdint>
#include <random>
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

// Repetition, presence and frequency penalties on `logits` [vocab], in place.
void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output);

// The distribution a draw comes from, [n]: one-hot at the argmax when greedy, else after
// temperature, top-k, top-p and min-p, renormalised. Penalties are the caller's (apply_penalties).
std::vector<double> sampling_probs(const float* logits, int64_t n, const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed.value_or(0)) {}

  // Draws from sampling_probs(logits) (no penalties): one uniform per draw, none when greedy.
  int32_t sample(const float* logits, int64_t n);
  // The full pipeline for a sequence's next token: logprobs, penalties over its tokens, draw.
  SampleResult sample(std::span<const float> logits, std::span<const int32_t> prompt, std::span<const int32_t> output);
  std::vector<double> probs(const float* logits, int64_t n) const { return sampling_probs(logits, n, p_); }
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace kiln
