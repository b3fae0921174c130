#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/cpu/sampling.h"
#include "ops/sampling_rng.h"

namespace kiln {
namespace {

ops::cpu::RowSampling row_sampling(const SamplingParams& p) {
  return {p.temperature, p.top_k, p.top_p, p.min_p};
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
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto [t, b] = logit_bias[i];
    KILN_CHECK(t >= 0 && t < vocab_size, "logit_bias: {} is outside the vocabulary [0, {})", t, vocab_size);
    KILN_CHECK(std::isfinite(b) && b >= -100 && b <= 100, "logit_bias: the bias of {} must be in [-100, 100], got {}",
               t, b);
    KILN_CHECK(i == 0 || logit_bias[i - 1].first < t, "logit_bias: ids must be ascending and distinct");
  }
  KILN_CHECK(top_logprobs >= 0 && top_logprobs <= vocab_size, "top_logprobs must be in [0, {}], got {}", vocab_size,
             top_logprobs);
}

int32_t argmax(const float* logits, int64_t n) {
  return ops::cpu::argmax_row(logits, n);
}

std::vector<float> log_softmax_row(const float* logits, int64_t n) {
  const float lse = ops::cpu::logsumexp_row(logits, n);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = logits[i] - lse;
  return out;
}

PenaltyTokens penalty_tokens(const SamplingParams& p, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  PenaltyTokens t;
  const bool rep = p.repetition_penalty != 1.0f, pf = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (!rep && !pf) return t;
  std::vector<int32_t> out(output.begin(), output.end());
  std::sort(out.begin(), out.end());
  std::vector<int32_t> seen;
  if (rep) {
    seen.assign(prompt.begin(), prompt.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  }
  // Merge the distinct prompt tokens with the counted output tokens, ids ascending.
  size_t i = 0, j = 0;
  while (i < seen.size() || j < out.size()) {
    const int32_t id = j == out.size() || (i < seen.size() && seen[i] < out[j]) ? seen[i] : out[j];
    int32_t c = 0;
    while (j < out.size() && out[j] == id) ++j, ++c;
    if (i < seen.size() && seen[i] == id) ++i;
    t.ids.push_back(id);
    t.counts.push_back(c);
  }
  return t;
}

void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output) {
  const PenaltyTokens t = penalty_tokens(p, prompt, output);
  ops::cpu::apply_penalties_row(logits.data(), t.ids.data(), t.counts.data(), static_cast<int64_t>(t.ids.size()),
                                p.repetition_penalty, p.presence_penalty, p.frequency_penalty);
}

std::vector<double> sampling_probs(const float* logits, int64_t n, const SamplingParams& p) {
  std::vector<double> dense(static_cast<size_t>(n), 0.0);
  if (p.temperature <= 0.0f) {
    dense[static_cast<size_t>(argmax(logits, n))] = 1.0;
    return dense;
  }
  const ops::cpu::KeptTokens k = ops::cpu::kept_tokens(logits, n, row_sampling(p));
  for (size_t j = 0; j < k.ids.size(); ++j) dense[static_cast<size_t>(k.ids[j])] = k.weights[j] / k.total;
  return dense;
}

int32_t Sampler::sample(const float* logits, int64_t n) {
  if (p_.temperature <= 0.0f) return argmax(logits, n);
  return ops::cpu::draw_kept(ops::cpu::kept_tokens(logits, n, row_sampling(p_)),
                             ops::sample_uniform(seed_, counter_++));
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  // The sample op itself on one row, so the engine's CPU path and the op cannot drift apart.
  const int64_t n = static_cast<int64_t>(logits.size());
  // logit_bias: the op draws from a biased copy; the logprobs are put back to the raw row's below.
  std::vector<float> biased;
  const std::span<const float> raw = logits;
  if (!p_.logit_bias.empty()) {
    biased.assign(logits.begin(), logits.end());
    for (const auto& [t, b] : p_.logit_bias)
      if (t < n) biased[static_cast<size_t>(t)] += b;  // validate() checked the ids; this row may be shorter
    logits = biased;
  }
  const PenaltyTokens pen = penalty_tokens(p_, prompt, output);
  const int32_t pen_off[2] = {0, static_cast<int32_t>(pen.ids.size())};
  const auto top_k = static_cast<int32_t>(std::clamp<int64_t>(p_.top_k, -1, std::numeric_limits<int32_t>::max()));
  const uint64_t counter = output.size();
  const int64_t num_top = std::min(p_.top_logprobs, ops::kMaxTopLogprobs);
  SampleResult r;
  std::vector<int32_t> top_ids(static_cast<size_t>(num_top));
  std::vector<float> top_lp(static_cast<size_t>(num_top));
  ops::SampleParams sp{logits.data(),
                       0,
                       1,
                       n,
                       &p_.temperature,
                       &top_k,
                       &p_.top_p,
                       &p_.min_p,
                       &p_.repetition_penalty,
                       &p_.presence_penalty,
                       &p_.frequency_penalty,
                       &seed_,
                       &counter,
                       pen_off,
                       pen.ids.data(),
                       pen.counts.data(),
                       num_top,
                       &r.token,
                       &r.logprob,
                       top_ids.data(),
                       top_lp.data()};
  ops::cpu::sample(sp);
  if (!p_.logprobs && p_.top_logprobs == 0) r.logprob = 0;
  for (int64_t j = 0; j < std::min(num_top, n); ++j)
    r.top.push_back({top_ids[static_cast<size_t>(j)], top_lp[static_cast<size_t>(j)]});
  // Beyond the op's 20 (a server allowing more), or a biased row: from the raw logits.
  if (p_.top_logprobs > ops::kMaxTopLogprobs || !biased.empty()) {
    const float lse = ops::cpu::logsumexp_row(raw.data(), n);
    if (p_.logprobs || p_.top_logprobs > 0) r.logprob = raw[static_cast<size_t>(r.token)] - lse;
    r.top.clear();
    for (int32_t t : ops::cpu::top_n_row(raw.data(), n, std::min(p_.top_logprobs, n)))
      r.top.push_back({t, raw[static_cast<size_t>(t)] - lse});
  }
  return r;
}

}  // namespace kiln
