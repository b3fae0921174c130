// CPU reference of the sample op: the obvious algorithm (sort what a cut needs, f64 weights,
// sequential sums). The order of penalties, the cut rules and the draw are the contract the CUDA
// kernel is tested against.
#include "ops/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/sampling_rng.h"

namespace kiln::ops::cpu {

int32_t argmax_row(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  return static_cast<int32_t>(best);
}

float logsumexp_row(const float* v, int64_t n) {
  const float mx = v[argmax_row(v, n)];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(v[i] - mx));
  return mx + static_cast<float>(std::log(sum));
}

std::vector<int32_t> top_n_row(const float* v, int64_t n, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [v](int32_t a, int32_t b) { return ranks_before(v, a, b); });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

void apply_penalties_row(float* logits, const int32_t* ids, const int32_t* counts, int64_t n_ids, float repetition,
                         float presence, float frequency) {
  for (int64_t j = 0; j < n_ids; ++j) {
    float& x = logits[ids[j]];
    // HF / vLLM repetition penalty on every token seen in the prompt or the output.
    if (repetition != 1.0f) x = x > 0 ? x / repetition : x * repetition;
    // OpenAI presence (once) and frequency (per occurrence) on tokens of the output.
    if (counts[j] > 0 && (presence != 0.0f || frequency != 0.0f))
      x -= frequency * static_cast<float>(counts[j]) + presence;
  }
}

KeptTokens kept_tokens(const float* l, int64_t n, const RowSampling& s) {
  const double mx = l[argmax_row(l, n)];
  const double temp = s.temperature;
  // Relative to the most likely token, whose weight is exactly 1 (min-p's reference).
  auto weight = [&](int32_t i) { return std::exp((static_cast<double>(l[i]) - mx) / temp); };
  auto before = [l](int32_t a, int32_t b) { return ranks_before(l, a, b); };
  std::vector<int32_t> cand(static_cast<size_t>(n));
  std::iota(cand.begin(), cand.end(), 0);
  if (s.top_k > 0 && s.top_k < n) {
    std::nth_element(cand.begin(), cand.begin() + s.top_k - 1, cand.end(), before);
    cand.resize(static_cast<size_t>(s.top_k));
  }
  if (s.top_p < 1.0f) {
    // The smallest most-likely-first prefix whose mass reaches top_p of the top-k mass (at least
    // one token). Sorted a slice at a time: the prefix usually ends within the first few hundred.
    double zk = 0;
    for (int32_t i : cand) zk += weight(i);
    const double target = static_cast<double>(s.top_p) * zk;
    size_t sorted = 0, keep = cand.size();
    double cum = 0;
    bool reached = false;
    for (size_t m = std::min<size_t>(1024, cand.size()); !reached; m = std::min(cand.size(), m * 8)) {
      std::partial_sort(cand.begin() + static_cast<int64_t>(sorted), cand.begin() + static_cast<int64_t>(m), cand.end(),
                        before);
      for (; sorted < m && !reached; ++sorted) {
        cum += weight(cand[sorted]);
        if (cum >= target) keep = sorted + 1, reached = true;
      }
      if (m == cand.size()) break;  // rounding kept cum below target: keep everything
    }
    cand.resize(keep);
  }
  if (s.min_p > 0.0f) {
    // The most likely token always survives top-k and top-p, so the top kept weight is 1.
    std::erase_if(cand, [&](int32_t i) { return weight(i) < static_cast<double>(s.min_p); });
  }
  std::sort(cand.begin(), cand.end());
  KeptTokens k;
  k.ids = std::move(cand);
  k.weights.reserve(k.ids.size());
  for (int32_t i : k.ids) {
    k.weights.push_back(weight(i));
    k.total += k.weights.back();
  }
  return k;
}

int32_t draw_kept(const KeptTokens& k, double u) {
  const double target = u * k.total;
  double cum = 0;
  for (size_t j = 0; j < k.ids.size(); ++j) {
    cum += k.weights[j];
    if (cum > target) return k.ids[j];
  }
  return k.ids.back();  // u * total rounded up to the total
}

void sample(const SampleParams& p) {
  const int64_t stride = p.logits_stride ? p.logits_stride : p.vocab;
  const int64_t ntop = std::min(p.num_top, p.vocab);
#pragma omp parallel for schedule(dynamic) if (p.rows > 1)
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* raw = p.logits + r * stride;
    const float lse = logsumexp_row(raw, p.vocab);
    if (p.num_top > 0) {
      const std::vector<int32_t> top = top_n_row(raw, p.vocab, ntop);
      for (int64_t j = 0; j < p.num_top; ++j) {
        const bool have = j < ntop;
        p.top_ids[r * p.num_top + j] = have ? top[static_cast<size_t>(j)] : -1;
        p.top_logprobs[r * p.num_top + j] =
            have ? raw[top[static_cast<size_t>(j)]] - lse : -std::numeric_limits<float>::infinity();
      }
    }
    const float rep = p.repetition[r], pres = p.presence[r], freq = p.frequency[r];
    std::vector<float> penalised;
    const float* src = raw;
    if (p.pen_offsets && p.pen_offsets[r + 1] > p.pen_offsets[r] && (rep != 1.0f || pres != 0.0f || freq != 0.0f)) {
      penalised.assign(raw, raw + p.vocab);
      const int32_t b = p.pen_offsets[r];
      apply_penalties_row(penalised.data(), p.pen_ids + b, p.pen_counts + b, p.pen_offsets[r + 1] - b, rep, pres, freq);
      src = penalised.data();
    }
    int32_t tok;
    if (p.temperature[r] <= 0.0f) {
      tok = argmax_row(src, p.vocab);
    } else {
      const KeptTokens k = kept_tokens(src, p.vocab, {p.temperature[r], p.top_k[r], p.top_p[r], p.min_p[r]});
      tok = draw_kept(k, sample_uniform(p.seed[r], p.counter[r]));
    }
    p.token[r] = tok;
    p.logprob[r] = raw[tok] - lse;
  }
}

}  // namespace kiln::ops::cpu
