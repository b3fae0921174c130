#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "core/error.h"

namespace kiln {
namespace {

// Kept tokens and their renormalised probabilities, in token order.
using Dist = std::vector<std::pair<int32_t, double>>;

// (value desc, index asc): a total order, so cuts at ties are deterministic.
template <typename V>
auto higher(const V& v) {
  return [&v](int32_t a, int32_t b) {
    return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)] ||
           (v[static_cast<size_t>(a)] == v[static_cast<size_t>(b)] && a < b);
  };
}

Dist transform(const float* logits, int64_t n, const SamplingParams& p) {
  if (p.temperature <= 0.0f) return {{argmax(logits, n), 1.0}};
  std::vector<double> scaled(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scaled[static_cast<size_t>(i)] = static_cast<double>(logits[i]) / p.temperature;
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  if (p.top_k > 0 && p.top_k < n) {
    std::nth_element(idx.begin(), idx.begin() + p.top_k - 1, idx.end(), higher(scaled));
    idx.resize(static_cast<size_t>(p.top_k));
  }
  // Softmax over the candidates: top-k's renormalisation.
  double mx = -INFINITY;
  for (int32_t i : idx) mx = std::max(mx, scaled[static_cast<size_t>(i)]);
  std::vector<double> prob(static_cast<size_t>(n), 0.0);
  double sum = 0;
  for (int32_t i : idx) sum += prob[static_cast<size_t>(i)] = std::exp(scaled[static_cast<size_t>(i)] - mx);
  for (int32_t i : idx) prob[static_cast<size_t>(i)] /= sum;
  if (p.top_p < 1.0f) {
    // The smallest most-likely-first prefix whose mass reaches top_p (at least one token).
    std::sort(idx.begin(), idx.end(), higher(prob));
    double cum = 0;
    size_t keep = idx.size();
    for (size_t j = 0; j < idx.size(); ++j) {
      cum += prob[static_cast<size_t>(idx[j])];
      if (cum >= p.top_p) {
        keep = j + 1;
        break;
      }
    }
    idx.resize(keep);
  }
  if (p.min_p > 0.0f) {
    double top = 0;
    for (int32_t i : idx) top = std::max(top, prob[static_cast<size_t>(i)]);
    const double cut = p.min_p * top;
    std::erase_if(idx, [&](int32_t i) { return prob[static_cast<size_t>(i)] < cut; });
  }
  std::sort(idx.begin(), idx.end());
  double kept = 0;
  for (int32_t i : idx) kept += prob[static_cast<size_t>(i)];
  Dist d;
  d.reserve(idx.size());
  for (int32_t i : idx) d.emplace_back(i, prob[static_cast<size_t>(i)] / kept);
  return d;
}

int32_t draw(const Dist& d, std::mt19937_64& rng) {
  if (d.size() == 1) return d[0].first;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  double cum = 0;
  for (const auto& [tok, pr] : d) {
    cum += pr;
    if (u < cum) return tok;
  }
  return d.back().first;  // u beyond the rounded total
}

}  // namespace

void SamplingParams::validate(int64_t vocab_size) const {
  KILN_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be >= 0, got {}", temperature);
  KILN_CHECK(top_k >= -1, "top_k must be >= -1 (-1 or 0: off), got {}", top_k);
  KILN_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got {}", top_p);
  KILN_CHECK(min_p >= 0 && min_p <= 1, "min_p must be in [0, 1], got {}", min_p);
  KILN_CHECK(repetition_penalty > 0 && std::isfinite(repetition_penalty), "repetition_penalty must be > 0, got {}",
             repetition_penalty);
  KILN_CHECK(presence_penalty >= -2 && presence_penalty <= 2, "presence_penalty must be in [-2, 2], got {}",
             presence_penalty);
  KILN_CHECK(frequency_penalty >= -2 && frequency_penalty <= 2, "frequency_penalty must be in [-2, 2], got {}",
             frequency_penalty);
  KILN_CHECK(max_tokens >= -1, "max_tokens must be >= 0 (or -1: up to the context limit), got {}", max_tokens);
  for (int32_t t : stop_token_ids)
    KILN_CHECK(t >= 0 && t < vocab_size, "stop_token_ids: {} is outside the vocabulary [0, {})", t, vocab_size);
  for (const auto& s : stop) KILN_CHECK(!s.empty(), "stop: stop strings must not be empty");
  KILN_CHECK(top_logprobs >= 0 && top_logprobs <= vocab_size, "top_logprobs must be in [0, {}], got {}", vocab_size,
             top_logprobs);
}

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

void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output) {
  if (p.repetition_penalty != 1.0f) {
    std::vector<int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(seen.end(), output.begin(), output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::vector<int32_t> out(output.begin(), output.end());
    std::sort(out.begin(), out.end());
    for (size_t i = 0; i < out.size();) {
      size_t j = i;
      while (j < out.size() && out[j] == out[i]) ++j;
      logits[static_cast<size_t>(out[i])] -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      i = j;
    }
  }
}

std::vector<double> sampling_probs(const float* logits, int64_t n, const SamplingParams& p) {
  std::vector<double> dense(static_cast<size_t>(n), 0.0);
  for (const auto& [tok, pr] : transform(logits, n, p)) dense[static_cast<size_t>(tok)] = pr;
  return dense;
}

int32_t Sampler::sample(const float* logits, int64_t n) {
  return draw(transform(logits, n, p_), rng_);
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  const int64_t n = static_cast<int64_t>(logits.size());
  SampleResult r;
  std::vector<float> lp;
  if (p_.logprobs || p_.top_logprobs > 0) lp = log_softmax_row(logits.data(), n);
  std::vector<float> l(logits.begin(), logits.end());
  apply_penalties(l, p_, prompt, output);
  r.token = draw(transform(l.data(), n, p_), rng_);
  if (lp.empty()) return r;
  r.logprob = lp[static_cast<size_t>(r.token)];
  if (p_.top_logprobs > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const auto k = static_cast<size_t>(std::min(p_.top_logprobs, n));
    std::partial_sort(idx.begin(), idx.begin() + static_cast<int64_t>(k), idx.end(), higher(lp));
    for (size_t j = 0; j < k; ++j) r.top.push_back({idx[j], lp[static_cast<size_t>(idx[j])]});
  }
  return r;
}

}  // namespace kiln
