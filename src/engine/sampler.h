// Token choice from one row of logits: greedy (argmax) or sampling with temperature, top-k and
// top-p (each renormalising what it keeps), from a per-request seeded generator.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kiln {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
};

// Index of the largest value; the lowest index wins ties (as torch.argmax).
int32_t argmax(const float* logits, int64_t n);

// log-probabilities of a row (f32 with a max shift, f64 sum).
std::vector<float> log_softmax_row(const float* logits, int64_t n);

class Sampler {
 public:
  explicit Sampler(SamplingParams p) : p_(p), rng_(p.seed) {}
  int32_t sample(const float* logits, int64_t n);
  // The distribution sample() draws from, after temperature, top-k and top-p.
  std::vector<double> probs(const float* logits, int64_t n) const;

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace kiln
