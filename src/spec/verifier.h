// The exact speculative verifier (DESIGN.md §6) on the CPU. Per sequence the drafter proposed
// x_1..x_k drawn from q_1..q_k; the target scored them in one forward and gave p_1..p_{k+1}; both
// are distributions after the request's own sampling transform (temperature, top-k, top-p, min-p).
// Draft i is accepted while u_i * q_i(x_i) < p_i(x_i); the first rejected position emits a draw
// from normalize(max(p_i - q_i, 0)); when all k pass, a bonus token is drawn from p_{k+1}. The
// emitted tokens are then distributed exactly as plain sampling from the target. Greedy rows
// (temperature 0) accept while x_i equals the argmax of p_i and emit the argmax where they stop.
//
// Randomness is the request's counter-based stream (ops/sampling_rng.h), indexed by the output
// position n of the token concerned, so a seed gives the same tokens on every backend and batch:
//   the final draw (residual or bonus) at position n uses sample_uniform(seed, n), the very
//   uniform plain sampling uses there (with k = 0 speculation is plain sampling);
//   the acceptance test of the draft at position n uses (seed, n | kAcceptStream);
//   a drafter sampling its proposal for position n uses (seed, n | kDraftStream).
// The acceptance and final-draw uniforms are each consumed at most once over a request's life. A
// drafter may redraw position n with the same uniform after a rejection discarded its earlier
// proposal there unverified; nothing emitted depended on that proposal, so the draws stay independent.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/sampling_params.h"

namespace kiln::spec {

inline constexpr uint64_t kAcceptStream = uint64_t{1} << 63;
inline constexpr uint64_t kDraftStream = uint64_t{1} << 62;

struct VerifyParams {
  const float* target_probs = nullptr;    // [num_seqs, max_draft + 1, vocab]: p_1..p_{k+1}, transformed
  const float* draft_probs = nullptr;     // [num_seqs, max_draft, vocab]: q_1..q_k, same transform (unread
                                          // for greedy rows; may be null when every row is greedy)
  const int32_t* draft_tokens = nullptr;  // [num_seqs, max_draft]: x_1..x_k
  const int32_t* num_draft = nullptr;     // [num_seqs]: k of each sequence, in [0, max_draft]
  const uint8_t* greedy = nullptr;        // [num_seqs]: 1 where the request's temperature is 0
  const uint64_t* seeds = nullptr;        // [num_seqs]: the request's seed
  const uint64_t* positions = nullptr;    // [num_seqs]: output index of the first token this step emits
  int64_t num_seqs = 0;
  int64_t max_draft = 0;
  int64_t vocab = 0;
  int32_t* out_tokens = nullptr;    // [num_seqs, max_draft + 1]: accepted drafts, then the final token
  int32_t* num_accepted = nullptr;  // [num_seqs]: drafts accepted; the row emits num_accepted + 1 tokens
};

// Checks the shapes and values (a clear kiln::Error naming the fault), then verifies every row.
void verify(const VerifyParams& p);

// The sampling transform over rows of logits into probabilities: out[r] is the distribution a
// plain draw from logits[r] comes from (engine/sampler.h sampling_probs: one-hot at the argmax for
// temperature 0, else temperature -> top-k -> top-p -> min-p, renormalised). Penalties are the
// caller's. logits: [rows, vocab]; out: [rows, vocab].
void sampling_probs_rows(const float* logits, int64_t rows, int64_t vocab, const SamplingParams& s, float* out);

// The first index (ascending) whose inclusive cumulative weight exceeds u * sum(weights): the
// draw the sample op makes, over any non-negative weights [n] with a positive sum.
int32_t draw_weighted(const float* weights, int64_t n, double u);

}  // namespace kiln::spec
