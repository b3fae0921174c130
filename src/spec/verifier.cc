#include "spec/verifier.h"

#include <cmath>

#include "core/error.h"
#include "engine/sampler.h"
#include "ops/cpu/sampling.h"
#include "ops/sampling_rng.h"

namespace kiln::spec {
namespace {

// Every value finite and >= 0, with a positive sum: a distribution a draw can come from.
void check_distribution(const float* row, int64_t vocab, const char* what, int64_t seq, int64_t pos) {
  double total = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    KILN_CHECK(std::isfinite(row[j]) && row[j] >= 0, "verify: {} of sequence {} position {} has a bad value {} at {}",
               what, seq, pos, row[j], j);
    total += row[j];
  }
  KILN_CHECK(total > 0, "verify: {} of sequence {} position {} sums to zero", what, seq, pos);
}

void check(const VerifyParams& p) {
  KILN_CHECK(p.num_seqs >= 0 && p.max_draft >= 0 && p.vocab > 0,
             "verify: bad sizes (num_seqs {}, max_draft {}, vocab {})", p.num_seqs, p.max_draft, p.vocab);
  if (p.num_seqs == 0) return;
  KILN_CHECK(p.target_probs && p.num_draft && p.greedy && p.seeds && p.positions && p.out_tokens && p.num_accepted,
             "verify: a required array (target_probs, num_draft, greedy, seeds, positions, out_tokens, "
             "num_accepted) is null");
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int32_t k = p.num_draft[s];
    KILN_CHECK(k >= 0 && k <= p.max_draft, "verify: sequence {} drafts {} tokens, outside [0, {}]", s, k, p.max_draft);
    KILN_CHECK(k == 0 || p.draft_tokens, "verify: sequence {} drafts {} tokens but draft_tokens is null", s, k);
    KILN_CHECK(p.greedy[s] || k == 0 || p.draft_probs,
               "verify: sequence {} samples (temperature > 0) but draft_probs is null", s);
    const float* target = p.target_probs + s * (p.max_draft + 1) * p.vocab;
    for (int32_t i = 0; i <= k; ++i) check_distribution(target + i * p.vocab, p.vocab, "target_probs", s, i);
    for (int32_t i = 0; i < k; ++i) {
      const int32_t x = p.draft_tokens[s * p.max_draft + i];
      KILN_CHECK(x >= 0 && x < p.vocab, "verify: draft token {} of sequence {} position {} is outside [0, {})", x, s, i,
                 p.vocab);
      if (p.greedy[s]) continue;
      const float* q = p.draft_probs + (s * p.max_draft + i) * p.vocab;
      check_distribution(q, p.vocab, "draft_probs", s, i);
      // A proposal the draft could not have drawn means the drafter and its probabilities disagree.
      KILN_CHECK(q[x] > 0, "verify: draft token {} of sequence {} position {} has draft probability 0", x, s, i);
    }
  }
}

// One sequence: the accepted prefix and the final token, written to out [k + 1]; returns how many
// drafts were accepted.
int32_t verify_row(const VerifyParams& p, int64_t s, int32_t* out) {
  const int32_t k = p.num_draft[s];
  const float* target = p.target_probs + s * (p.max_draft + 1) * p.vocab;
  const int32_t* drafts = k > 0 ? p.draft_tokens + s * p.max_draft : nullptr;
  const uint64_t seed = p.seeds[s], first = p.positions[s];
  if (p.greedy[s]) {
    int32_t a = 0;
    while (a < k && drafts[a] == ops::cpu::argmax_row(target + a * p.vocab, p.vocab)) out[a] = drafts[a], ++a;
    out[a] = ops::cpu::argmax_row(target + a * p.vocab, p.vocab);
    return a;
  }
  for (int32_t i = 0; i < k; ++i) {
    const float* pi = target + i * p.vocab;
    const float* qi = p.draft_probs + (s * p.max_draft + i) * p.vocab;
    const int32_t x = drafts[i];
    const double u = ops::sample_uniform(seed, (first + static_cast<uint64_t>(i)) | kAcceptStream);
    if (u * static_cast<double>(qi[x]) < static_cast<double>(pi[x])) {
      out[i] = x;
      continue;
    }
    // Rejected: the residual max(p - q, 0) carries exactly the mass the acceptance test left out.
    std::vector<float> residual(static_cast<size_t>(p.vocab));
    double mass = 0;
    for (int64_t j = 0; j < p.vocab; ++j) {
      residual[static_cast<size_t>(j)] = std::max(pi[j] - qi[j], 0.0f);
      mass += residual[static_cast<size_t>(j)];
    }
    const double v = ops::sample_uniform(seed, first + static_cast<uint64_t>(i));
    // Zero mass needs p == q to the last bit, where no rejection can happen; rounding aside, p is the answer.
    out[i] = mass > 0 ? draw_weighted(residual.data(), p.vocab, v) : draw_weighted(pi, p.vocab, v);
    return i;
  }
  out[k] = draw_weighted(target + k * p.vocab, p.vocab, ops::sample_uniform(seed, first + static_cast<uint64_t>(k)));
  return k;
}

}  // namespace

void verify(const VerifyParams& p) {
  check(p);
  for (int64_t s = 0; s < p.num_seqs; ++s) p.num_accepted[s] = verify_row(p, s, p.out_tokens + s * (p.max_draft + 1));
}

void sampling_probs_rows(const float* logits, int64_t rows, int64_t vocab, const SamplingParams& s, float* out) {
  KILN_CHECK(rows >= 0 && vocab > 0, "sampling_probs_rows: bad sizes (rows {}, vocab {})", rows, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> probs = sampling_probs(logits + r * vocab, vocab, s);
    for (int64_t j = 0; j < vocab; ++j) out[r * vocab + j] = static_cast<float>(probs[static_cast<size_t>(j)]);
  }
}

int32_t draw_weighted(const float* weights, int64_t n, double u) {
  // The sample op's own draw (ops/cpu/sampling.h draw_kept) over the positive weights.
  ops::cpu::KeptTokens kept;
  for (int64_t j = 0; j < n; ++j) {
    if (!(weights[j] > 0)) continue;
    kept.ids.push_back(static_cast<int32_t>(j));
    kept.weights.push_back(weights[j]);
    kept.total += weights[j];
  }
  KILN_CHECK(!kept.ids.empty(), "draw_weighted: no positive weight among {} values", n);
  return ops::cpu::draw_kept(kept, u);
}

}  // namespace kiln::spec
