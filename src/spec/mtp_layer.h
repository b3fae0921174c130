// DeepSeek-V3's NextN / MTP layer as a model of its own (DESIGN.md §6): for a row at position t it
// reads the target's hidden state h[t] and the next token x[t+1],
//   h' = eh_proj([enorm(embed(x[t+1])) ; hnorm(h[t])])     (this order: tools/train_small_models.py)
// runs one full decoder layer on h' (MLA over its own paged latent cache, RoPE position t, then MoE
// or dense FFN), and predicts x[t+2] with shared_head.head(shared_head.norm(out)). The decoder layer
// and head run as a one-layer DeepseekV3Model whose inputs are h' instead of token embeddings, so
// every backend runs it with the target's own ops.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/deepseek_v3.h"

namespace kiln::spec {

class MtpLayer {
 public:
  // NextN layer `index` of the checkpoint in `dir`, whose main model has config `target`.
  MtpLayer(const std::string& dir, const ModelConfig& target, ops::Backend& be, int64_t index = 0);
  ~MtpLayer();

  // The one-layer model's config (the target's, with one decoder layer).
  const ModelConfig& config() const { return layer_->config(); }
  ops::Backend& backend() const { return layer_->backend(); }
  // A latent cache for the layer: one layer of the target's row width.
  LatentKvPool new_pool(int64_t num_blocks, int64_t block_size) const {
    return layer_->new_pool(num_blocks, block_size);
  }

  // One step over `batch` (tokens: each row's next token x[t+1]; positions: t) with `h` [T, hidden]
  // on the host, the hidden state of each row. Writes the rows' latent KV to `pool`; returns the
  // logits of batch.logit_rows [rows, vocab], and `normed` gets those rows' shared_head.norm
  // outputs [rows, hidden]: the h of the next chained step.
  std::vector<float> forward(const ForwardBatch& batch, std::span<const float> h, LatentKvPool& pool,
                             std::vector<float>& normed);

 private:
  MtpWeights w_;
  std::unique_ptr<DeepseekV3Model> layer_;  // the decoder layer; final norm and lm_head are shared_head's
};

}  // namespace kiln::spec
