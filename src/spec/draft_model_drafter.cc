#include "spec/draft_model_drafter.h"

#include <algorithm>

#include "core/error.h"
#include "ops/sampling_rng.h"
#include "spec/verifier.h"

namespace kiln::spec {

DraftModelDrafter::DraftModelDrafter(DeepseekV3Model& draft, int64_t capacity) : draft_(draft), capacity_(capacity) {
  KILN_CHECK(capacity >= 2, "draft model: cache capacity must be at least 2 tokens, got {}", capacity);
}

void DraftModelDrafter::propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) {
  const int64_t vocab = vocab_size();
  KILN_CHECK(k >= 1, "draft model: number of draft tokens must be >= 1, got {}", k);
  out.num_seqs = static_cast<int64_t>(seqs.size()), out.k = k, out.vocab = vocab;
  out.tokens.assign(static_cast<size_t>(out.num_seqs * k), 0);
  out.probs.assign(static_cast<size_t>(out.num_seqs * k * vocab), 0.0f);
  for (size_t s = 0; s < seqs.size(); ++s)
    propose_one(seqs[s], k, out.tokens.data() + s * static_cast<size_t>(k),
                out.probs.data() + s * static_cast<size_t>(k * vocab));
}

void DraftModelDrafter::propose_one(const DraftInput& in, int64_t k, int32_t* tokens, float* probs) {
  const int64_t vocab = vocab_size(), n = static_cast<int64_t>(in.context.size());
  KILN_CHECK(n >= 1, "draft model: sequence {} has an empty context", in.seq_id);
  KILN_CHECK(in.sampling, "draft model: sequence {} has no sampling parameters", in.seq_id);
  KILN_CHECK(n + k - 1 <= capacity_, "draft model: sequence {} needs {} cached tokens, over the draft cache's {}",
             in.seq_id, n + k - 1, capacity_);
  for (int32_t t : in.context)
    KILN_CHECK(t >= 0 && t < vocab, "draft model: token {} of sequence {} is outside the draft vocabulary [0, {})", t,
               in.seq_id, vocab);
  auto it = seqs_.find(in.seq_id);
  if (it == seqs_.end()) it = seqs_.emplace(in.seq_id, SeqState{draft_.new_cache(capacity_), {}}).first;
  SeqState& st = it->second;
  // Keep the cached rows that still match the context (a rollback the caller missed is harmless),
  // and always re-run at least the last token: its logits give the first proposal.
  const auto mismatch = std::mismatch(st.fed.begin(), st.fed.end(), in.context.begin(), in.context.end());
  const int64_t keep = std::min<int64_t>(mismatch.first - st.fed.begin(), n - 1);
  st.fed.resize(static_cast<size_t>(keep));
  st.cache.length = keep;

  std::vector<int32_t> step(in.context.begin() + keep, in.context.end());
  for (int64_t i = 0; i < k; ++i) {
    const std::vector<float> logits = draft_.forward(step, st.cache, /*all_logits=*/false);
    st.fed.insert(st.fed.end(), step.begin(), step.end());
    float* q = probs + i * vocab;
    sampling_probs_rows(logits.data(), 1, vocab, *in.sampling, q);
    const uint64_t pos = in.position + static_cast<uint64_t>(i);
    tokens[i] = in.sampling->temperature <= 0.0f
                    ? static_cast<int32_t>(std::max_element(q, q + vocab) - q)  // one-hot at the argmax
                    : draw_weighted(q, vocab, ops::sample_uniform(in.seed, pos | kDraftStream));
    step.assign(1, tokens[i]);
  }
}

void DraftModelDrafter::rollback(int64_t seq_id, int64_t keep) {
  KILN_CHECK(keep >= 0, "draft model: rollback of sequence {} to a negative length {}", seq_id, keep);
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  SeqState& st = it->second;
  st.fed.resize(std::min(st.fed.size(), static_cast<size_t>(keep)));
  st.cache.length = static_cast<int64_t>(st.fed.size());  // rows past it get overwritten by the next step
}

}  // namespace kiln::spec
