#include "spec/block_drafter_speculator.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "ops/sampling_rng.h"
#include "spec/hidden_states.h"
#include "spec/verifier.h"

namespace kiln::spec {

std::vector<int32_t> block_drafter_taps(const std::vector<int64_t>& ids, int64_t target_layers,
                                        const std::string& source) {
  std::vector<int32_t> taps;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    KILN_CHECK(id != -1,
               "{}: target_layer_ids[{}] = -1 (the embedding output) has no hidden-state tap in Kiln; drafts "
               "reading target layers >= 0 only are supported",
               source, i);
    KILN_CHECK(id >= 0 && id < target_layers, "{}: target_layer_ids[{}] = {} is not a layer of the {}-layer target",
               source, i, id, target_layers);
    // HF's hidden_states[L] (DeepSpec's id L - 1) is the last layer's output after the final norm.
    taps.push_back(id == target_layers - 1 ? kHiddenFinalNorm : static_cast<int32_t>(id));
  }
  return taps;
}

void check_block_drafter_fits(const BlockDrafterConfig& c, const ModelConfig& t, const std::string& src) {
  KILN_CHECK(c.hidden() == t.hidden_size, "{}: the draft's hidden_size {} is not the target's {}", src, c.hidden(),
             t.hidden_size);
  KILN_CHECK(c.vocab() == t.vocab_size, "{}: the draft's vocab_size {} is not the target's {}", src, c.vocab(),
             t.vocab_size);
  KILN_CHECK(c.num_target_layers == t.num_hidden_layers,
             "{}: the draft's num_target_layers {} is not the target's num_hidden_layers {} (target_layer_ids "
             "would name other layers)",
             src, c.num_target_layers, t.num_hidden_layers);
  block_drafter_taps(c.target_layer_ids, t.num_hidden_layers, src);
}

BlockDrafter::BlockDrafter(std::unique_ptr<BlockDrafterModel> model, DeepseekV3Model& target)
    : model_(std::move(model)), target_(target) {
  KILN_CHECK(model_, "block drafter: no model");
  KILN_CHECK(&model_->backend() == &target.backend(),
             "block drafter: the draft and the target are on different backends");
  check_block_drafter_fits(model_->config(), target.config(), "block drafter");
  taps_ = block_drafter_taps(model_->config().target_layer_ids, target.config().num_hidden_layers, "block drafter");
}

std::unique_ptr<BlockDrafter> BlockDrafter::load(const std::string& dir, DeepseekV3Model& target) {
  const std::string cfg = (std::filesystem::path(dir) / "config.json").string();
  // Before the weights: a draft for another target fails on the field, not on a tensor's shape.
  check_block_drafter_fits(load_block_drafter_config(cfg), target.config(), cfg);
  return std::make_unique<BlockDrafter>(BlockDrafterModel::load(dir, target.backend(), &target.weights()), target);
}

void BlockDrafter::accept_hidden(int64_t seq_id, int64_t first, int64_t rows, std::span<const float> hidden) {
  const auto F = static_cast<size_t>(model_->config().feature_dim());
  KILN_CHECK(first >= 0 && rows >= 0 && hidden.size() >= static_cast<size_t>(rows) * F,
             "internal: block drafter got {} hidden values for {} rows of sequence {}", hidden.size(), rows, seq_id);
  SeqState& st = seqs_[seq_id];
  // [rows, taps, H] with the taps in target_layer_ids' order is already [rows, feature_dim]. Rows
  // in the context (a preempted request's recompute) are not needed again.
  for (int64_t r = 0; r < rows; ++r)
    if (first + r >= st.ctx.length)
      st.pending[first + r].assign(hidden.begin() + static_cast<std::ptrdiff_t>(r * F),
                                   hidden.begin() + static_cast<std::ptrdiff_t>((r + 1) * F));
}

void BlockDrafter::rollback(int64_t seq_id, int64_t keep) {
  KILN_CHECK(keep >= 0, "block drafter: rollback of sequence {} to a negative length {}", seq_id, keep);
  // The context holds committed positions before the anchor only (the block's rows are scratch),
  // so this drops nothing after a verify; it matters when a caller rewinds further.
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end() || it->second.ctx.length <= keep) return;
  model_->truncate_context(it->second.ctx, keep);
  it->second.tokens.resize(static_cast<size_t>(keep));
}

void BlockDrafter::reserve(SeqState& st, int64_t rows) {
  if (!st.ctx.pools.empty() && rows <= st.ctx.capacity) return;
  BlockDrafterContext grown = model_->new_context(std::max<int64_t>({rows, 2 * st.ctx.capacity, 256}));
  ops::Backend& be = model_->backend();
  for (size_t l = 0; l < st.ctx.pools.size(); ++l) {  // rare (doubling): through the host, on every backend
    std::vector<uint8_t> bytes(grown.pools[l].t.nbytes(), 0);
    be.download(bytes.data(), st.ctx.pools[l].t);  // row-major: the old rows are the new pool's first
    be.upload(grown.pools[l].t, bytes.data());
  }
  grown.length = st.ctx.length;
  st.ctx = std::move(grown);
}

void BlockDrafter::propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) {
  const int64_t V = vocab_size(), B = block_size(), S = static_cast<int64_t>(seqs.size());
  const auto F = static_cast<size_t>(model_->config().feature_dim());
  KILN_CHECK(k >= 1 && k <= B, "block drafter: {} drafts asked of a block of {}", k, B);
  out.num_seqs = S, out.k = k, out.vocab = V;
  out.tokens.assign(static_cast<size_t>(S * k), 0);
  out.probs.assign(static_cast<size_t>(S * k * V), 0.0f);
  // The context is every position before the anchor: [0, n - 1). What it holds past a changed
  // token is dropped; what it lacks comes from the engine's hidden states or a rebuild.
  std::vector<SeqState*> st(seqs.size());
  std::vector<HiddenRecompute> want(seqs.size());
  bool rebuild = false;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const DraftInput& in = seqs[s];
    KILN_CHECK(!in.context.empty() && in.sampling, "block drafter: sequence {} has no context or sampling parameters",
               in.seq_id);
    SeqState& state = seqs_[in.seq_id];
    const int64_t n = static_cast<int64_t>(in.context.size());
    const auto m = std::mismatch(state.tokens.begin(), state.tokens.end(), in.context.begin(), in.context.end() - 1);
    const int64_t same = m.first - state.tokens.begin();
    if (same < state.ctx.length) rollback(in.seq_id, same);
    want[s].tokens = in.context;
    for (int64_t p = state.ctx.length; p < n - 1; ++p)
      if (!state.pending.contains(p)) want[s].positions.push_back(p);
    rebuild = rebuild || !want[s].positions.empty();
    st[s] = &state;
  }
  if (rebuild) {
    const std::vector<float> h = recompute_hidden(target_, want, taps_);  // [rows, taps, H]
    size_t row = 0;
    for (size_t s = 0; s < seqs.size(); ++s)
      for (int64_t p : want[s].positions) {
        const auto at = h.begin() + static_cast<std::ptrdiff_t>(row++ * F);
        st[s]->pending[p].assign(at, at + static_cast<std::ptrdiff_t>(F));
      }
    rebuilt_ += static_cast<int64_t>(row);
    spdlog::debug("block drafter: rebuilt {} context rows with the target", row);
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    const DraftInput& in = seqs[s];
    SeqState& state = *st[s];
    const int64_t n = static_cast<int64_t>(in.context.size());
    std::vector<float> rows;  // the new context rows [n - 1 - length, F], one append
    for (int64_t p = state.ctx.length; p < n - 1; ++p) {
      const std::vector<float>& f = state.pending.at(p);
      rows.insert(rows.end(), f.begin(), f.end());
    }
    reserve(state, n - 1);
    model_->append_context(state.ctx, rows);
    state.tokens.assign(in.context.begin(), in.context.end() - 1);
    state.pending.erase(state.pending.begin(), state.pending.lower_bound(n - 1));

    const BlockDraft d = model_->propose(state.ctx, in.context.back());
    state.confidence = d.confidence;
    for (int64_t i = 0; i < k; ++i) {
      float* q = out.probs.data() + static_cast<size_t>((static_cast<int64_t>(s) * k + i) * V);
      sampling_probs_rows(d.logits.data() + i * V, 1, V, *in.sampling, q);
      const uint64_t pos = in.position + static_cast<uint64_t>(i);
      out.tokens[static_cast<size_t>(static_cast<int64_t>(s) * k + i)] =
          in.sampling->temperature <= 0.0f
              ? static_cast<int32_t>(std::max_element(q, q + V) - q)  // one-hot at the argmax
              : draw_weighted(q, V, ops::sample_uniform(in.seed, pos | kDraftStream));
    }
  }
}

std::vector<float> BlockDrafter::confidence(int64_t seq_id) const {
  const auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? std::vector<float>{} : it->second.confidence;
}

int64_t BlockDrafter::context_length(int64_t seq_id) const {
  const auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? -1 : it->second.ctx.length;
}

}  // namespace kiln::spec
