#include "spec/mtp_drafter.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "ops/sampling_rng.h"
#include "spec/draft_cache.h"
#include "spec/hidden_states.h"
#include "spec/verifier.h"

namespace kiln::spec {

MtpDrafter::MtpDrafter(std::unique_ptr<MtpLayer> layer, DeepseekV3Model& target, int64_t num_blocks, int64_t block_size)
    : layer_(std::move(layer)), target_(target) {
  KILN_CHECK(layer_, "MTP drafter: no layer");
  KILN_CHECK(num_blocks > 0 && block_size > 0, "MTP drafter: bad KV pool of {} blocks of {}", num_blocks, block_size);
  KILN_CHECK(&layer_->backend() == &target.backend(),
             "MTP drafter: the layer and the target are on different backends");
  pool_ = layer_->new_pool(num_blocks, block_size);
  alloc_ = std::make_unique<kv::BlockAllocator>(num_blocks);
}

void MtpDrafter::size_cache(int64_t tokens) {
  KILN_CHECK(tokens > 0, "MTP drafter: cache of {} tokens", tokens);
  const int64_t bs = pool_.block_size;
  seqs_.clear();
  pool_ = {};  // the old pool goes before the new one is allocated
  int64_t bytes_per_block = 0;
  for (const auto& l : layer_->new_pool(1, bs).layers) bytes_per_block += static_cast<int64_t>(l.t.nbytes());
  // One layer's rows: small beside the target's pool; still at most half of what is left.
  const int64_t blocks =
      draft_cache_blocks("MTP layer KV cache", tokens, bs, bytes_per_block, layer_->backend().free_memory_bytes());
  pool_ = layer_->new_pool(blocks, bs);
  alloc_ = std::make_unique<kv::BlockAllocator>(blocks);
}

void MtpDrafter::drop(SeqState& st) {
  for (int32_t b : st.blocks) alloc_->decref(b);
  st.blocks.clear();
  st.ctx.clear();
}

void MtpDrafter::release(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  drop(it->second);
  seqs_.erase(it);
}

void MtpDrafter::rollback(int64_t seq_id, int64_t keep) {
  KILN_CHECK(keep >= 0, "MTP drafter: rollback of sequence {} to a negative length {}", seq_id, keep);
  // The cache holds true rows of committed tokens only (chained rows are overwritten next call), so
  // keeping `keep` tokens drops nothing the verifier accepted.
  if (auto it = seqs_.find(seq_id); it != seqs_.end() && static_cast<int64_t>(it->second.ctx.size()) > keep)
    it->second.ctx.resize(static_cast<size_t>(keep));
}

void MtpDrafter::accept_hidden(int64_t seq_id, int64_t first, int64_t rows, std::span<const float> hidden) {
  const int64_t H = layer_->config().hidden_size;
  KILN_CHECK(first >= 0 && rows >= 0 && static_cast<int64_t>(hidden.size()) >= rows * H,
             "internal: MTP drafter got {} hidden values for {} rows of sequence {}", hidden.size(), rows, seq_id);
  SeqState& st = seqs_[seq_id];
  // Rows already in the cache (a preempted request recomputed) need theirs no more, but the last
  // fed one is kept: the next call re-runs it for the first draft.
  const int64_t keep_from = std::max<int64_t>(0, st.rows() - 1);
  for (int64_t r = 0; r < rows; ++r)
    if (first + r >= keep_from) st.hidden[first + r].assign(hidden.begin() + r * H, hidden.begin() + (r + 1) * H);
}

void MtpDrafter::reserve(int64_t id, SeqState& st, int64_t tokens, std::span<const DraftInput> busy) {
  reserve_draft_blocks("MTP drafter", *alloc_, pool_.block_size, seqs_, id, st.blocks, tokens, busy,
                       [&](SeqState& s) { drop(s); });
}

void MtpDrafter::propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) {
  const int64_t B = static_cast<int64_t>(seqs.size());
  if (!begin_proposal("MTP drafter", seqs, k, vocab_size(), out)) return;
  std::vector<SeqState*> st(static_cast<size_t>(B));
  std::vector<int64_t> first(static_cast<size_t>(B)), missing(static_cast<size_t>(B), -1);
  for (int64_t s = 0; s < B; ++s) {
    const DraftInput& in = seqs[static_cast<size_t>(s)];
    const auto n = static_cast<int64_t>(in.context.size());
    KILN_CHECK(n >= 2, "MTP drafter: sequence {} has {} tokens; drafting needs the prompt and a first output",
               in.seq_id, n);
    check_draft_input("MTP drafter", seqs, static_cast<size_t>(s));
    SeqState& state = seqs_[in.seq_id];
    // Rows stay while their tokens (and so their hidden states) are the context's; the last true
    // row n - 2 always runs again: its logits give the first draft.
    const auto m = std::mismatch(state.ctx.begin(), state.ctx.end(), in.context.begin(), in.context.end());
    state.ctx.resize(static_cast<size_t>(m.first - state.ctx.begin()));
    first[static_cast<size_t>(s)] = std::min(state.rows(), n - 2);
    for (int64_t t = first[static_cast<size_t>(s)]; t < n - 1; ++t)
      if (!state.hidden.contains(t)) missing[static_cast<size_t>(s)] = t;
    st[static_cast<size_t>(s)] = &state;
  }
  for (int64_t s = 0; s < B; ++s) {
    const DraftInput& in = seqs[static_cast<size_t>(s)];
    // True rows up to n - 2, chained rows up to n + k - 3.
    reserve(in.seq_id, *st[static_cast<size_t>(s)], static_cast<int64_t>(in.context.size()) + k - 2, seqs);
  }
  forget_on_failure(
      [&] {
        if (std::any_of(missing.begin(), missing.end(), [](int64_t t) { return t >= 0; }))
          rebuild(seqs, first, missing, st);
        step_all(seqs, st, first, k, out);
      },
      [&] {
        for (SeqState* state : st) state->ctx.clear();
      });
}

void MtpDrafter::rebuild(std::span<const DraftInput> seqs, const std::vector<int64_t>& first,
                         const std::vector<int64_t>& last_missing, const std::vector<SeqState*>& st) {
  const auto H = static_cast<size_t>(layer_->config().hidden_size);
  std::vector<HiddenRecompute> want(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    want[s].tokens = seqs[s].context;
    for (int64_t p = first[s]; p <= last_missing[s]; ++p)
      if (!st[s]->hidden.contains(p)) want[s].positions.push_back(p);
  }
  const std::vector<float> h = recompute_hidden(target_, want, hidden_taps(), pool_.block_size);  // [rows, H]
  size_t row = 0;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t p : want[s].positions) {
      const auto at = h.begin() + static_cast<std::ptrdiff_t>(row++ * H);
      st[s]->hidden[p].assign(at, at + static_cast<std::ptrdiff_t>(H));
    }
  rebuilt_ += static_cast<int64_t>(row);
  spdlog::debug("MTP drafter: rebuilt {} hidden states with the target", row);
}

void MtpDrafter::step_all(std::span<const DraftInput> seqs, const std::vector<SeqState*>& st,
                          const std::vector<int64_t>& first, int64_t k, DraftOutput& out) {
  const int64_t vocab = vocab_size(), B = static_cast<int64_t>(seqs.size()), bs = pool_.block_size;
  const auto H = static_cast<size_t>(layer_->config().hidden_size);
  std::vector<float> normed;  // [B, H]: each sequence's last row's shared_head.norm output
  for (int64_t i = 0; i < k; ++i) {
    // Step 0 feeds each sequence its true rows [first, n - 1): (h[t], x[t + 1]) at position t.
    // Step i > 0 feeds one chained row at position n - 2 + i: (the last output, draft i).
    ForwardBatch b;
    std::vector<float> h;  // [T, H]
    b.cu_q.push_back(0);
    for (int64_t s = 0; s < B; ++s) {
      const DraftInput& in = seqs[static_cast<size_t>(s)];
      SeqState& state = *st[static_cast<size_t>(s)];
      const auto n = static_cast<int64_t>(in.context.size());
      const int64_t start = i == 0 ? first[static_cast<size_t>(s)] : n - 2 + i, end = i == 0 ? n - 1 : start + 1;
      for (int64_t t = start; t < end; ++t) {
        if (i == 0) {
          const std::vector<float>& ht = state.hidden.at(t);
          h.insert(h.end(), ht.begin(), ht.end());
          b.tokens.push_back(in.context[static_cast<size_t>(t + 1)]);
        } else {
          h.insert(h.end(), normed.begin() + static_cast<int64_t>(s * H),
                   normed.begin() + static_cast<int64_t>((s + 1) * H));
          b.tokens.push_back(out.tokens[static_cast<size_t>(s * k + i - 1)]);
        }
        b.positions.push_back(static_cast<int32_t>(t));
        b.slot_mapping.push_back(kv::slot_of(state.blocks, t, bs));
      }
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      b.cu_q.push_back(static_cast<int32_t>(b.tokens.size()));
      b.kv_lens.push_back(static_cast<int32_t>(end));
      b.max_blocks = std::max(b.max_blocks, kv::blocks_for(end, bs));
    }
    for (int64_t s = 0; s < B; ++s) {
      const SeqState& state = *st[static_cast<size_t>(s)];
      const int64_t used = kv::blocks_for(b.kv_lens[static_cast<size_t>(s)], bs);
      b.block_tables.insert(b.block_tables.end(), state.blocks.begin(), state.blocks.begin() + used);
      b.block_tables.insert(b.block_tables.end(), static_cast<size_t>(b.max_blocks - used), 0);
    }
    const std::vector<float> logits = layer_->forward(b, h, pool_, normed);  // [B, vocab], normed [B, H]
    if (i == 0)
      for (int64_t s = 0; s < B; ++s) {  // the true rows are in: the context's, up to n - 2
        SeqState& state = *st[static_cast<size_t>(s)];
        const std::span<const int32_t> ctx = seqs[static_cast<size_t>(s)].context;
        state.ctx.assign(ctx.begin(), ctx.end());
        const auto n = static_cast<int64_t>(ctx.size());
        state.hidden.erase(state.hidden.begin(), state.hidden.lower_bound(n - 2));
      }
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
