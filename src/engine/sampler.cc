#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kiln {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

std::vector<float> log_softmax_row(const float* logits, int64_t n) {
  float mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = logits[i] - lse;
  return out;
}

std::vector<double> Sampler::probs(const float* logits, int64_t n) const {
  std::vector<double> p(static_cast<size_t>(n), 0.0);
  if (p_.temperature <= 0.0f) {
    p[static_cast<size_t>(argmax(logits, n))] = 1.0;
    return p;
  }
  double mx = *std::max_element(logits, logits + n) / p_.temperature;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += p[static_cast<size_t>(i)] = std::exp(logits[i] / p_.temperature - mx);
  for (auto& v : p) v /= sum;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  int64_t keep = n;
  if (p_.top_k > 0) keep = std::min(keep, p_.top_k);
  if (p_.top_p < 1.0f) {
    // Keep the smallest prefix whose mass reaches top_p (at least one token).
    double cum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += p[static_cast<size_t>(order[static_cast<size_t>(i)])];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[static_cast<size_t>(order[static_cast<size_t>(i)])];
  for (int64_t i = keep; i < n; ++i) p[static_cast<size_t>(order[static_cast<size_t>(i)])] = 0.0;
  for (auto& v : p) v /= kept;
  return p;
}

int32_t Sampler::sample(const float* logits, int64_t n) {
  if (p_.temperature <= 0.0f) return argmax(logits, n);
  std::vector<double> p = probs(logits, n);
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0;
  int32_t last = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (p[static_cast<size_t>(i)] <= 0) continue;
    last = static_cast<int32_t>(i);
    cum += p[static_cast<size_t>(i)];
    if (u < cum) return last;
  }
  return last;
}

}  // namespace kiln
