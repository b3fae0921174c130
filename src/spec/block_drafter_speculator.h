// The DSpark-style block drafter (spec/block_drafter_model.h) as a Drafter for the engine
// (`--speculative-algorithm dspark`, issue 41 drafter 3).
//
// Context: the draft reads the target's hidden states after the layers its config names
// (target_layer_ids, DeepSpec's convention: id i is HF's hidden_states[i + 1]). Kiln's taps
// (model/forward_batch.h) name the same streams differently, so block_drafter_taps() maps them
// and refuses what has no tap. Each committed position's taps, side by side, are one context
// feature row; the engine hands them over (accept_hidden) and propose() appends them to the
// sequence's BlockDrafterContext up to the position before the anchor (the last committed token),
// rebuilding with the target (spec/hidden_states.h) those the engine never computed (prefix-cache
// hits) or that a preempted request's recompute handed over again.
//
// Drafts: one forward proposes a block of B; a step takes its first k <= B. At temperature 0 they
// are the block's greedy tokens (q one-hot). Sampled requests draw draft k from q_k, the request's
// transform of the block's logits at k. Those logits carry the Markov bias of the greedy token at
// k - 1, not of the token drawn there; that only lowers acceptance once the two differ, because
// q_k is still a fixed distribution given what was drawn before, and the verifier is exact for any
// such q (DESIGN.md §6).
#pragma once

#include <map>
#include <memory>
#include <unordered_map>

#include "model/deepseek_v3.h"
#include "spec/block_drafter_model.h"
#include "spec/drafter.h"

namespace kiln::spec {

// Kiln's hidden taps for a draft's target_layer_ids on a target of `target_layers` layers:
// i in [0, target_layers - 1) is the residual stream after layer i (tap i); the last layer's
// entry in HF's hidden_states is after the final norm (kHiddenFinalNorm). -1 (the embedding
// output) has no tap and is refused, naming the field.
std::vector<int32_t> block_drafter_taps(const std::vector<int64_t>& target_layer_ids, int64_t target_layers,
                                        const std::string& source);

// Checks that the draft config in `dir` fits `target` (hidden_size, vocab_size, num_target_layers,
// target_layer_ids), naming the field that does not.
void check_block_drafter_fits(const BlockDrafterConfig& c, const ModelConfig& target, const std::string& source);

class BlockDrafter : public Drafter {
 public:
  // `target`: the model whose hidden states the draft reads (same backend); used to rebuild them.
  BlockDrafter(std::unique_ptr<BlockDrafterModel> model, DeepseekV3Model& target);
  // Loads the DeepSpec-format draft in `dir` with the target's embedding and lm_head.
  static std::unique_ptr<BlockDrafter> load(const std::string& dir, DeepseekV3Model& target);

  int64_t vocab_size() const override { return model_->config().vocab(); }
  int64_t block_size() const { return model_->config().block_size; }
  void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) override;
  void rollback(int64_t seq_id, int64_t keep) override;
  void release(int64_t seq_id) override { seqs_.erase(seq_id); }
  std::vector<int32_t> hidden_taps() const override { return taps_; }
  void accept_hidden(int64_t seq_id, int64_t first, int64_t rows, std::span<const float> hidden) override;

  // The confidence head's estimate that each of the sequence's last proposals is accepted ([B];
  // empty without a head or a proposal): for a policy choosing K from it.
  std::vector<float> confidence(int64_t seq_id) const;
  int64_t num_states() const { return static_cast<int64_t>(seqs_.size()); }
  // Context rows rebuilt with the target so far (positions the engine never handed over).
  int64_t rebuilt_positions() const { return rebuilt_; }
  // Context rows held for a sequence (positions [0, n)); -1 when it has no state.
  int64_t context_length(int64_t seq_id) const;

 private:
  struct SeqState {
    BlockDrafterContext ctx;
    std::vector<int32_t> tokens;                    // the tokens at the context's positions
    std::map<int64_t, std::vector<float>> pending;  // feature rows [taps * H] by position, not appended yet
    std::vector<float> confidence;
  };
  // Makes room for `rows` context rows, copying the pools into larger ones (doubling).
  void reserve(SeqState& st, int64_t rows);

  std::unique_ptr<BlockDrafterModel> model_;
  DeepseekV3Model& target_;
  std::vector<int32_t> taps_;
  std::unordered_map<int64_t, SeqState> seqs_;
  int64_t rebuilt_ = 0;
};

}  // namespace kiln::spec
