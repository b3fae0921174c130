// The engine's speculation (engine/speculator.h) over any Drafter: drafts for the step's
// speculating rows, then the exact verifier (spec/verifier.h) on the target's logits of each row,
// and the drafter rolled back to the accepted prefix. Verification runs on the host.
#pragma once

#include <memory>
#include <string>

#include "engine/speculator.h"
#include "model/deepseek_v3.h"
#include "spec/drafter.h"

namespace kiln::spec {

class DrafterSpeculator : public Speculator {
 public:
  // `k`: drafts per step (K >= 1); `vocab`: the target's vocabulary, which the drafter's must equal.
  // `max_len`: the longest sequence the drafter can take.
  DrafterSpeculator(std::unique_ptr<Drafter> drafter, int64_t k, int64_t vocab, std::string name,
                    int64_t max_len = INT64_MAX);

  int64_t num_draft_tokens() const override { return k_; }
  const char* name() const override { return name_.c_str(); }
  int64_t max_len() const override { return max_len_; }
  void draft(std::span<const SpecSeq> seqs, std::vector<std::vector<int32_t>>& drafts) override;
  std::vector<std::vector<int32_t>> verify(std::span<const SpecSeq> seqs,
                                           std::span<const std::vector<float>> logits) override;
  void release(uint64_t id) override { drafter_->release(static_cast<int64_t>(id)); }
  void size_cache(int64_t tokens) override { drafter_->size_cache(tokens); }
  std::vector<int32_t> hidden_taps() const override { return drafter_->hidden_taps(); }
  void accept_hidden(uint64_t id, int64_t first, int64_t rows, std::span<const float> hidden) override {
    drafter_->accept_hidden(static_cast<int64_t>(id), first, rows, hidden);
  }

 private:
  std::unique_ptr<Drafter> drafter_;
  int64_t k_, vocab_, max_len_;
  std::string name_;
  DraftOutput last_;  // the last draft() call's proposals and their probabilities
};

// `--speculative-algorithm draft`: the draft model in `dir` (same tokenizer as the target) on the
// target's backend, K drafts per step. `mtp` (or `deepseek_mtp`): the first NextN layer of the
// checkpoint in `dir` (the target's own), fed the target's hidden states. `dspark`: the DeepSpec-format block drafter
// in `dir` (spec/block_drafter_speculator.h), reading the target's hidden states, with K <= its block size.
std::shared_ptr<Speculator> make_speculator(const std::string& algorithm, const std::string& model_dir, int64_t k,
                                            DeepseekV3Model& target);

}  // namespace kiln::spec
