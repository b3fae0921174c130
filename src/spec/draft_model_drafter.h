// The draft-model drafter: a second, smaller checkpoint of the same tokenizer (e.g.
// models/kiln-tiny-draft for models/kiln-tiny) with its own KV cache per sequence, run K
// sequential single-token steps to propose K tokens.
#pragma once

#include <unordered_map>

#include "model/deepseek_v3.h"
#include "spec/drafter.h"

namespace kiln::spec {

class DraftModelDrafter : public Drafter {
 public:
  // `capacity`: the most tokens (context + proposals) one sequence's draft cache holds.
  DraftModelDrafter(DeepseekV3Model& draft, int64_t capacity);

  int64_t vocab_size() const override { return draft_.config().vocab_size; }
  void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) override;
  void rollback(int64_t seq_id, int64_t keep) override;
  void release(int64_t seq_id) override { seqs_.erase(seq_id); }

 private:
  struct SeqState {
    SequenceCache cache;
    std::vector<int32_t> fed;  // [cache.length]: the tokens whose latent rows the cache holds
  };
  // Proposes k tokens after `in.context` into tokens [k] and probs [k, vocab].
  void propose_one(const DraftInput& in, int64_t k, int32_t* tokens, float* probs);

  DeepseekV3Model& draft_;
  int64_t capacity_;
  std::unordered_map<int64_t, SeqState> seqs_;
};

}  // namespace kiln::spec
