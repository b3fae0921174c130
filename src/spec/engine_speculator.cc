#include "spec/engine_speculator.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "spec/block_drafter_speculator.h"
#include "spec/mtp_drafter.h"
#include "spec/paged_draft_drafter.h"
#include "spec/verifier.h"

namespace kiln::spec {
namespace {

// A PagedDraftModelDrafter that owns its model.
class OwnedDraftModel : public Drafter {
 public:
  explicit OwnedDraftModel(std::unique_ptr<DeepseekV3Model> model)
      : model_(std::move(model)), drafter_(*model_, kDefaultBlocks, kBlockSize) {}
  int64_t vocab_size() const override { return drafter_.vocab_size(); }
  void propose(std::span<const DraftInput> seqs, int64_t k, DraftOutput& out) override {
    drafter_.propose(seqs, k, out);
  }
  void rollback(int64_t seq_id, int64_t keep) override { drafter_.rollback(seq_id, keep); }
  void release(int64_t seq_id) override { drafter_.release(seq_id); }
  void size_cache(int64_t tokens) override { drafter_.size_cache(tokens); }

 private:
  // Until the engine sizes it: room for a few sequences.
  static constexpr int64_t kBlockSize = 16, kDefaultBlocks = 256;
  std::unique_ptr<DeepseekV3Model> model_;
  PagedDraftModelDrafter drafter_;
};

}  // namespace

DrafterSpeculator::DrafterSpeculator(std::unique_ptr<Drafter> drafter, int64_t k, int64_t vocab, std::string name,
                                     int64_t max_len)
    : drafter_(std::move(drafter)), k_(k), vocab_(vocab), max_len_(max_len), name_(std::move(name)) {
  KILN_CHECK(drafter_, "speculative decoding: no drafter");
  KILN_CHECK(k >= 1, "speculative decoding: the number of draft tokens must be >= 1, got {}", k);
  KILN_CHECK(drafter_->vocab_size() == vocab,
             "speculative decoding: the drafter's vocabulary ({}) is not the target's ({})", drafter_->vocab_size(),
             vocab);
}

void DrafterSpeculator::draft(std::span<const SpecSeq> seqs, std::vector<std::vector<int32_t>>& drafts) {
  drafts.assign(seqs.size(), {});
  last_ = {};
  if (seqs.empty()) return;
  // One propose for all at the largest k; a row wanting fewer uses the first of its proposals.
  int64_t k = 0;
  std::vector<DraftInput> in;
  for (const SpecSeq& s : seqs) {
    KILN_CHECK(s.k >= 1 && s.k <= k_, "speculative decoding: request {} wants {} drafts, outside [1, {}]", s.id, s.k,
               k_);
    k = std::max(k, s.k);
    in.push_back({static_cast<int64_t>(s.id), s.context, s.sampling, s.seed, s.position});
  }
  drafter_->propose(in, k, last_);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t* t = last_.tokens.data() + i * static_cast<size_t>(k);
    drafts[i].assign(t, t + seqs[i].k);
  }
}

std::vector<std::vector<int32_t>> DrafterSpeculator::verify(std::span<const SpecSeq> seqs,
                                                            std::span<const std::vector<float>> logits) {
  KILN_CHECK(seqs.size() == logits.size() && static_cast<int64_t>(seqs.size()) == last_.num_seqs,
             "internal: verifying {} sequences with {} logit blocks after drafting for {}", seqs.size(), logits.size(),
             last_.num_seqs);
  std::vector<std::vector<int32_t>> emitted(seqs.size());
  std::vector<float> target;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SpecSeq& s = seqs[i];
    const auto k = static_cast<int32_t>(s.k);
    KILN_CHECK(static_cast<int64_t>(logits[i].size()) == (k + 1) * vocab_,
               "internal: request {} has {} logits for {} drafts of vocabulary {}", s.id, logits[i].size(), k, vocab_);
    target.resize(logits[i].size());
    sampling_probs_rows(logits[i].data(), k + 1, vocab_, *s.sampling, target.data());
    const uint8_t greedy = s.sampling->temperature <= 0.0f;
    int32_t accepted = 0;
    std::vector<int32_t> out(static_cast<size_t>(k) + 1);
    VerifyParams vp;
    vp.target_probs = target.data();
    // Row i's proposals sit at stride last_.k; its first k are the ones verified.
    vp.draft_probs = last_.probs.data() + i * static_cast<size_t>(last_.k * vocab_);
    vp.draft_tokens = last_.tokens.data() + i * static_cast<size_t>(last_.k);
    vp.num_draft = &k;
    vp.greedy = &greedy;
    vp.seeds = &s.seed;
    vp.positions = &s.position;
    vp.num_seqs = 1, vp.max_draft = k, vp.vocab = vocab_;
    vp.out_tokens = out.data();
    vp.num_accepted = &accepted;
    spec::verify(vp);
    out.resize(static_cast<size_t>(accepted) + 1);
    emitted[i] = std::move(out);
    drafter_->rollback(static_cast<int64_t>(s.id), static_cast<int64_t>(s.context.size()) + accepted);
  }
  return emitted;
}

std::shared_ptr<Speculator> make_speculator(const std::string& algorithm, const std::string& model_dir, int64_t k,
                                            DeepseekV3Model& target) {
  const bool mtp = algorithm == "mtp" || algorithm == "deepseek_mtp";
  KILN_CHECK(algorithm == "draft" || algorithm == "dspark" || mtp,
             "unknown --speculative-algorithm '{}' (draft, mtp, deepseek_mtp or dspark)", algorithm);
  KILN_CHECK(k >= 1 && k <= 16, "--speculative-num-tokens must be in [1, 16], got {}", k);
  const int64_t vocab = target.config().vocab_size;
  if (algorithm == "dspark") {
    KILN_CHECK(!model_dir.empty(), "--speculative-algorithm dspark needs --speculative-model DIR");
    auto drafter = BlockDrafter::load(model_dir, target);
    // One forward drafts one block: more drafts than it holds would need a second, chained forward.
    KILN_CHECK(k <= drafter->block_size(), "--speculative-num-tokens {} exceeds the DSpark draft's block_size {} ({})",
               k, drafter->block_size(), model_dir);
    spdlog::info(
        "speculative decoding: DSpark block drafter {} (block of {}, {} target layers tapped), {} draft "
        "tokens per step",
        model_dir, drafter->block_size(), drafter->hidden_taps().size(), k);
    return std::make_shared<DrafterSpeculator>(std::move(drafter), k, vocab, "dspark");
  }
  if (mtp) {
    constexpr int64_t kMtpBlockSize = 16, kMtpBlocks = 256;  // until the engine sizes its cache
    KILN_CHECK(!model_dir.empty(), "--speculative-algorithm mtp needs the checkpoint holding the MTP layer");
    auto layer = std::make_unique<MtpLayer>(model_dir, target.config(), target.backend());
    spdlog::info("speculative decoding: the MTP layer of {} ({} FFN), {} draft tokens per step", model_dir,
                 layer->config().first_k_dense_replace == 0 ? "MoE" : "dense", k);
    return std::make_shared<DrafterSpeculator>(
        std::make_unique<MtpDrafter>(std::move(layer), target, kMtpBlocks, kMtpBlockSize), k, vocab, "mtp");
  }
  KILN_CHECK(!model_dir.empty(), "--speculative-algorithm draft needs --speculative-model DIR");
  auto draft = DeepseekV3Model::load(model_dir, target.backend());
  if (draft->config().max_position_embeddings < target.config().max_position_embeddings)
    spdlog::warn("draft model {}: {} positions, fewer than the target's {}: longer requests decode plainly", model_dir,
                 draft->config().max_position_embeddings, target.config().max_position_embeddings);
  spdlog::info("speculative decoding: draft model {} ({} layers, hidden {}), {} draft tokens per step", model_dir,
               draft->config().num_hidden_layers, draft->config().hidden_size, k);
  const int64_t positions = draft->config().max_position_embeddings;
  return std::make_shared<DrafterSpeculator>(std::make_unique<OwnedDraftModel>(std::move(draft)), k, vocab, "draft",
                                             positions);
}

}  // namespace kiln::spec
