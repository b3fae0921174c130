// What every drafter offers the speculative loop (DESIGN.md §3, §6): for a batch of sequences,
// propose k tokens each together with the draft distributions they were drawn from, and forget
// what a rejection made stale. A drafter keeps per-sequence state (a draft model's KV cache, an
// MTP layer's cache) keyed by the caller's sequence id.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace kiln::spec {

struct DraftInput {
  int64_t seq_id = 0;                        // the caller's id for this sequence's drafter state
  std::span<const int32_t> context;          // [n]: every committed token (prompt then output), n >= 1
  const SamplingParams* sampling = nullptr;  // the request's transform; temperature 0 drafts greedily
  uint64_t seed = 0;                         // the request's seed
  uint64_t position = 0;                     // output index of the first proposed token
};

struct DraftOutput {
  int64_t num_seqs = 0, k = 0, vocab = 0;
  std::vector<int32_t> tokens;  // [num_seqs, k]
  std::vector<float> probs;     // [num_seqs, k, vocab]: q_i after the request's transform
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual int64_t vocab_size() const = 0;
  // Proposes k >= 1 tokens after each sequence's context. A sampled proposal for output position n
  // is drawn from q with the uniform (seed, n | kDraftStream) (spec/verifier.h).
  virtual void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) = 0;
  // After verification: only the first `keep` tokens of the sequence's last context plus its last
  // proposals are still true (context + accepted drafts); state past them is dropped.
  virtual void rollback(int64_t seq_id, int64_t keep) = 0;
  // The sequence is finished: its state is freed.
  virtual void release(int64_t seq_id) = 0;
  // How many tokens of context the caller keeps in flight at most (the engine: its KV pool and
  // K per sequence); a drafter with a cache of its own sizes it from this, dropping any state.
  virtual void size_cache(int64_t /*tokens*/) {}
  // The target hidden states the drafter reads, and their delivery (engine/speculator.h).
  virtual std::vector<int32_t> hidden_taps() const { return {}; }
  virtual void accept_hidden(int64_t /*seq_id*/, int64_t /*first*/, int64_t /*rows*/,
                             std::span<const float> /*hidden*/) {}
};

}  // namespace kiln::spec
