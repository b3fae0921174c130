// The draft-model drafter for the engine: the draft checkpoint's latent KV lives in its own paged
// pool (blocks from its own allocator), and each of the K draft steps is one forward batched over
// every speculating sequence. The first step also catches a sequence's cache up with what it has
// not fed yet (the prompt the first time, then the tokens the last verify emitted), so it mixes
// prompt-sized rows with one-token rows as any engine step does.
#pragma once

#include <memory>
#include <unordered_map>

#include "kv/block_allocator.h"
#include "model/deepseek_v3.h"
#include "spec/drafter.h"

namespace kiln::spec {

class PagedDraftModelDrafter : public Drafter {
 public:
  // `num_blocks` blocks of `block_size` tokens for the draft model's cache of every sequence.
  PagedDraftModelDrafter(DeepseekV3Model& draft, int64_t num_blocks, int64_t block_size);
  // A new pool for `tokens` tokens (every sequence's state is dropped).
  void size_cache(int64_t tokens) override;

  int64_t vocab_size() const override { return draft_.config().vocab_size; }
  void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) override;
  void rollback(int64_t seq_id, int64_t keep) override;
  void release(int64_t seq_id) override;

  int64_t num_free_blocks() const { return alloc_->num_free(); }
  int64_t num_states() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  struct SeqState {
    std::vector<int32_t> blocks;  // pool blocks in order, one reference each
    std::vector<int32_t> fed;     // [cached tokens]: the tokens whose latent rows the cache holds
  };
  // Grows st's table to `tokens` tokens; when the pool runs short, other sequences' caches (not in
  // `busy`) are dropped: they are rebuilt from their context when next drafted.
  void reserve(int64_t id, SeqState& st, int64_t tokens, std::span<const DraftInput> busy);
  void drop(SeqState& st);
  // The k draft forwards, each batched over every sequence.
  void step_all(std::span<const DraftInput> seqs, const std::vector<SeqState*>& st, int64_t k, DraftOutput& out);

  DeepseekV3Model& draft_;
  LatentKvPool pool_;
  std::unique_ptr<kv::BlockAllocator> alloc_;
  std::unordered_map<int64_t, SeqState> seqs_;
};

}  // namespace kiln::spec
