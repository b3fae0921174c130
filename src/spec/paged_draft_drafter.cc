#include "spec/paged_draft_drafter.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "ops/sampling_rng.h"
#include "spec/draft_cache.h"
#include "spec/verifier.h"

namespace kiln::spec {

PagedDraftModelDrafter::PagedDraftModelDrafter(DeepseekV3Model& draft, int64_t num_blocks, int64_t block_size)
    : draft_(draft) {
  KILN_CHECK(num_blocks > 0 && block_size > 0, "draft model: bad KV pool of {} blocks of {}", num_blocks, block_size);
  pool_ = draft.new_pool(num_blocks, block_size);
  alloc_ = std::make_unique<kv::BlockAllocator>(num_blocks);
}

void PagedDraftModelDrafter::size_cache(int64_t tokens) {
  KILN_CHECK(tokens > 0, "draft model: cache of {} tokens", tokens);
  const int64_t bs = pool_.block_size;
  seqs_.clear();
  pool_ = {};  // the old pool goes before the new one is allocated
  int64_t bytes_per_block = 0;
  for (const auto& layer : draft_.new_pool(1, bs).layers) bytes_per_block += static_cast<int64_t>(layer.t.nbytes());
  const int64_t blocks =
      draft_cache_blocks("draft model KV cache", tokens, bs, bytes_per_block, draft_.backend().free_memory_bytes());
  pool_ = draft_.new_pool(blocks, bs);
  alloc_ = std::make_unique<kv::BlockAllocator>(blocks);
}

void PagedDraftModelDrafter::drop(SeqState& st) {
  for (int32_t b : st.blocks) alloc_->decref(b);
  st.blocks.clear();
  st.fed.clear();
}

void PagedDraftModelDrafter::release(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  drop(it->second);
  seqs_.erase(it);
}

void PagedDraftModelDrafter::rollback(int64_t seq_id, int64_t keep) {
  KILN_CHECK(keep >= 0, "draft model: rollback of sequence {} to a negative length {}", seq_id, keep);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  // Rows past `keep` are overwritten when the sequence is next fed; its blocks stay for that.
  it->second.fed.resize(std::min(it->second.fed.size(), static_cast<size_t>(keep)));
}

void PagedDraftModelDrafter::reserve(int64_t id, SeqState& st, int64_t tokens, std::span<const DraftInput> busy) {
  reserve_draft_blocks("draft model", *alloc_, pool_.block_size, seqs_, id, st.blocks, tokens, busy,
                       [&](SeqState& s) { drop(s); });
}

void PagedDraftModelDrafter::propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) {
  const int64_t vocab = vocab_size(), B = static_cast<int64_t>(seqs.size());
  if (!begin_proposal("draft model", seqs, k, vocab, out)) return;
  std::vector<SeqState*> st(static_cast<size_t>(B));
  for (int64_t s = 0; s < B; ++s) {
    const DraftInput& in = seqs[static_cast<size_t>(s)];
    KILN_CHECK(!in.context.empty(), "draft model: sequence {} has an empty context", in.seq_id);
    check_draft_input("draft model", seqs, static_cast<size_t>(s));
    for (int32_t t : in.context)
      KILN_CHECK(t >= 0 && t < vocab, "draft model: token {} of sequence {} is outside the draft vocabulary [0, {})", t,
                 in.seq_id, vocab);
    SeqState& state = seqs_[in.seq_id];
    // Keep the cached rows that still match the context, and always re-run at least the last
    // token: its logits give the first proposal.
    const auto mismatch = std::mismatch(state.fed.begin(), state.fed.end(), in.context.begin(), in.context.end());
    const auto n = static_cast<int64_t>(in.context.size());
    state.fed.resize(static_cast<size_t>(std::min<int64_t>(mismatch.first - state.fed.begin(), n - 1)));
    st[static_cast<size_t>(s)] = &state;
  }
  for (int64_t s = 0; s < B; ++s) {
    const DraftInput& in = seqs[static_cast<size_t>(s)];
    reserve(in.seq_id, *st[static_cast<size_t>(s)], static_cast<int64_t>(in.context.size()) + k - 1, seqs);
  }

  forget_on_failure([&] { step_all(seqs, st, k, out); },
                    [&] {
                      for (SeqState* state : st) state->fed.clear();
                    });
}

void PagedDraftModelDrafter::step_all(std::span<const DraftInput> seqs, const std::vector<SeqState*>& st, int64_t k,
                                      DraftOutput& out) {
  const int64_t vocab = vocab_size(), B = static_cast<int64_t>(seqs.size()), bs = pool_.block_size;
  for (int64_t i = 0; i < k; ++i) {
    // Step i feeds each sequence what its cache lacks: the unfed context at i = 0, then its last proposal.
    ForwardBatch b;
    b.cu_q.push_back(0);
    for (int64_t s = 0; s < B; ++s) {
      const DraftInput& in = seqs[static_cast<size_t>(s)];
      SeqState& state = *st[static_cast<size_t>(s)];
      const auto start = static_cast<int64_t>(state.fed.size());
      if (i == 0)
        state.fed.insert(state.fed.end(), in.context.begin() + start, in.context.end());
      else
        state.fed.push_back(out.tokens[static_cast<size_t>(s * k + i - 1)]);
      const auto end = static_cast<int64_t>(state.fed.size());
      b.max_blocks = std::max(b.max_blocks, kv::blocks_for(end, bs));
      for (int64_t p = start; p < end; ++p) {
        b.tokens.push_back(state.fed[static_cast<size_t>(p)]);
        b.positions.push_back(static_cast<int32_t>(p));
        b.slot_mapping.push_back(kv::slot_of(state.blocks, p, bs));
      }
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      b.cu_q.push_back(static_cast<int32_t>(b.tokens.size()));
      b.kv_lens.push_back(static_cast<int32_t>(end));
    }
    for (int64_t s = 0; s < B; ++s) {
      const SeqState& state = *st[static_cast<size_t>(s)];
      const int64_t used = kv::blocks_for(static_cast<int64_t>(state.fed.size()), bs);
      b.block_tables.insert(b.block_tables.end(), state.blocks.begin(), state.blocks.begin() + used);
      b.block_tables.insert(b.block_tables.end(), static_cast<size_t>(b.max_blocks - used), 0);
    }
    const std::vector<float> logits = draft_.forward(b, pool_);  // [B, vocab]
    for (int64_t s = 0; s < B; ++s) {
      const DraftInput& in = seqs[static_cast<size_t>(s)];
      float* q = out.probs.data() + static_cast<size_t>((s * k + i) * vocab);
      sampling_probs_rows(logits.data() + s * vocab, 1, vocab, *in.sampling, q);
      const uint64_t pos = in.position + static_cast<uint64_t>(i);
      out.tokens[static_cast<size_t>(s * k + i)] =
          in.sampling->temperature <= 0.0f
              ? static_cast<int32_t>(std::max_element(q, q + vocab) - q)  // one-hot at the argmax
              : draw_weighted(q, vocab, ops::sample_uniform(in.seed, pos | kDraftStream));
    }
  }
}

}  // namespace kiln::spec
