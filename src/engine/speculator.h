// What the engine needs from speculative decoding (DESIGN.md §6), as an interface: the drafters
// and the verifier live in spec/, above the engine, and plug in through EngineConfig::speculator.
// Each step the engine asks for drafts for its speculating decode rows, runs the target once over
// [last token, drafts] of each (mixed with the step's other rows), and hands the logits back to
// be verified; the speculator keeps whatever it needs between the two calls (draft probabilities)
// and rolls its own state back to the accepted prefix.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace kiln {

struct SpecSeq {
  uint64_t id = 0;                           // the request: the key of the drafter's state
  std::span<const int32_t> context;          // [n]: every committed token (prompt then output)
  const SamplingParams* sampling = nullptr;  // the request's transform (temperature 0: greedy)
  uint64_t seed = 0;                         // the request's seed
  uint64_t position = 0;                     // output index of the first token this step emits
  int64_t k = 0;                             // drafts wanted, >= 1
};

class Speculator {
 public:
  virtual ~Speculator() = default;
  // The most drafts per sequence and step (K); the scheduler asks fewer near max_tokens.
  virtual int64_t num_draft_tokens() const = 0;
  virtual const char* name() const = 0;  // the algorithm, e.g. "draft"
  // The longest sequence (prompt + output) the drafter can draft for (a draft model's positions);
  // longer requests decode plainly.
  virtual int64_t max_len() const = 0;
  // drafts[i] gets seqs[i].k proposals.
  virtual void draft(std::span<const SpecSeq> seqs, std::vector<std::vector<int32_t>>& drafts) = 0;
  // After the target forward: logits[i] is [seqs[i].k + 1, vocab], the target's scores at the
  // last committed token and at each draft. Returns per sequence the tokens it emits (accepted
  // drafts, then the residual or bonus token) and drops drafter state past the accepted prefix.
  // `seqs` are the ones the last draft() call got, in the same order.
  virtual std::vector<std::vector<int32_t>> verify(std::span<const SpecSeq> seqs,
                                                   std::span<const std::vector<float>> logits) = 0;
  // The request is finished: its drafter state goes.
  virtual void release(uint64_t id) = 0;
  // The target's hidden states this speculator reads (ForwardBatch::hidden_taps: kHiddenFinalNorm
  // for an MTP layer, layer indices for a block drafter). Empty: none, and the engine asks for none.
  virtual std::vector<int32_t> hidden_taps() const { return {}; }
  // After each step, for every speculating request in it: the target's hidden states at its newly
  // committed positions [first, first + rows) (a prompt chunk, a plain decode row, or a verify row's
  // last token and accepted drafts), [rows, taps, hidden] on the host. Positions the target did not
  // compute (prefix-cache hits) never come: a speculator rebuilds what it lacks.
  virtual void accept_hidden(uint64_t /*id*/, int64_t /*first*/, int64_t /*rows*/, std::span<const float> /*hidden*/) {}
  // Called once by the engine with the most tokens its sequences hold at once (KV pool and
  // drafts): what a drafter's own cache needs.
  virtual void size_cache(int64_t tokens) = 0;
};

}  // namespace kiln
