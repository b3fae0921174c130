// The MTP / NextN drafter (issue 41, DESIGN.md §6): the checkpoint's own NextN layer (spec/mtp_layer.h)
// proposes K tokens per sequence from the target's last hidden states.
//
// Row t of the layer's paged cache is a "true" row: its input is the target's hidden state h[t]
// (after the final norm: what lm_head sees, as the bundled layer was trained and as SGLang and vLLM
// feed DeepSeek-V3's) with the committed token x[t+1]. With n committed tokens, the last true row
// t = n-2 predicts x[n] (the first draft); draft j+1 comes from a chained row at position n-2+j fed
// the previous row's shared_head.norm output and draft j, attending to the true rows and the chain
// before it. Chained rows are never kept: the next call overwrites them with true rows, which is
// the rollback. Hidden states come from the engine for every committed position it computes
// (Speculator::accept_hidden); those it never computed (prefix-cache hits), or that a dropped
// cache lost, are rebuilt by running the target over the sequence's prefix in a scratch cache.
#pragma once

#include <map>
#include <memory>
#include <unordered_map>

#include "kv/block_allocator.h"
#include "spec/drafter.h"
#include "spec/mtp_layer.h"

namespace kiln::spec {

class MtpDrafter : public Drafter {
 public:
  // `target`: the model the layer belongs to (same backend); only used to rebuild hidden states.
  // `num_blocks` blocks of `block_size` tokens for the layer's cache of every sequence.
  MtpDrafter(std::unique_ptr<MtpLayer> layer, DeepseekV3Model& target, int64_t num_blocks, int64_t block_size);
  void size_cache(int64_t tokens) override;

  int64_t vocab_size() const override { return layer_->config().vocab_size; }
  void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) override;
  void rollback(int64_t seq_id, int64_t keep) override;
  void release(int64_t seq_id) override;
  std::vector<int32_t> hidden_taps() const override { return {kHiddenFinalNorm}; }
  void accept_hidden(int64_t seq_id, int64_t first, int64_t rows, std::span<const float> hidden) override;

  int64_t num_free_blocks() const { return alloc_->num_free(); }
  int64_t num_states() const { return static_cast<int64_t>(seqs_.size()); }
  // Hidden states rebuilt with the target so far (positions the engine never handed over).
  int64_t rebuilt_positions() const { return rebuilt_; }

 private:
  struct SeqState {
    std::vector<int32_t> blocks;  // pool blocks in order, one reference each
    // The context whose true rows the cache holds: rows 0 .. ctx.size() - 2.
    std::vector<int32_t> ctx;
    // The target's hidden states [hidden] by position: not fed yet, or the last one fed (re-run for
    // the first draft).
    std::map<int64_t, std::vector<float>> hidden;
    int64_t rows() const { return ctx.empty() ? 0 : static_cast<int64_t>(ctx.size()) - 1; }
  };
  void reserve(int64_t id, SeqState& st, int64_t tokens, std::span<const DraftInput> busy);
  void drop(SeqState& st);
  // Recomputes with the target (spec/hidden_states.h) the hidden states sequence s lacks in
  // [first[s], last_missing[s]] (last_missing -1: none).
  void rebuild(std::span<const DraftInput> seqs, const std::vector<int64_t>& first,
               const std::vector<int64_t>& last_missing, const std::vector<SeqState*>& st);
  // The catch-up step (true rows from `first[s]`) then k - 1 chained steps, batched over sequences.
  void step_all(std::span<const DraftInput> seqs, const std::vector<SeqState*>& st, const std::vector<int64_t>& first,
                int64_t k, DraftOutput& out);

  std::unique_ptr<MtpLayer> layer_;
  DeepseekV3Model& target_;
  LatentKvPool pool_;
  std::unique_ptr<kv::BlockAllocator> alloc_;
  std::unordered_map<int64_t, SeqState> seqs_;
  int64_t rebuilt_ = 0;
};

}  // namespace kiln::spec
