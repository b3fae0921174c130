// The CPU reference of the sample op (params.h SampleParams), row by row, in plain loops with
// f64 probabilities. The engine's Sampler calls these row functions directly; the CUDA kernel is
// tested against them.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/params.h"

namespace kiln::ops::cpu {

// What one row asks of the draw (the off values are those of SampleParams).
struct RowSampling {
  float temperature = 1.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

// The kept tokens of a row and their unnormalised weights exp((l - max) / T), ids ascending:
// the order the draw walks.
struct KeptTokens {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double total = 0;  // sum of weights, in id order
};

// (value desc, index asc): the total order every cut follows.
inline bool ranks_before(const float* v, int32_t a, int32_t b) {
  return v[a] > v[b] || (v[a] == v[b] && a < b);
}

// Index of the largest value; the lowest index wins ties (as torch.argmax).
int32_t argmax_row(const float* v, int64_t n);

// log(sum(exp(v))) with a max shift (f32 max, f64 sum).
float logsumexp_row(const float* v, int64_t n);

// The k first tokens of the order (k <= n), most likely first.
std::vector<int32_t> top_n_row(const float* v, int64_t n, int64_t k);

// Penalties on one row in place. `ids` are distinct; `counts` their occurrences in the output.
void apply_penalties_row(float* logits, const int32_t* ids, const int32_t* counts, int64_t n_ids, float repetition,
                         float presence, float frequency);

// temperature (> 0) -> top-k -> top-p -> min-p over a row of (penalised) logits.
KeptTokens kept_tokens(const float* logits, int64_t vocab, const RowSampling& s);

// The first kept token (id order) whose inclusive cumulative weight exceeds u * total.
int32_t draw_kept(const KeptTokens& k, double u);

// The whole op; rows in parallel.
void sample(const SampleParams& p);

}  // namespace kiln::ops::cpu
