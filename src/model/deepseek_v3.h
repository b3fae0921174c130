// The DeepSeek-V3 forward, written once against the op interface (DESIGN.md §4), over a batch
// of sequences whose latent KV (one row of kv_lora + rope values per token per layer: normalised
// c_kv ‖ roped k_pe) lives in a paged pool.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace kiln {

// Which MLA form attention runs in.
enum class MlaForm { Auto, Expanded, Absorbed };  // Auto: expanded for prompts, absorbed for 1 token

// One sequence with a private pool whose blocks are simply 0, 1, 2, ...: for `kiln score`,
// `kiln generate` and tests, without the engine's allocator.
struct SequenceCache {
  LatentKvPool pool;
  int64_t capacity = 0;
  int64_t length = 0;  // tokens already cached
};

class DeepseekV3Model {
 public:
  DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend);
  // Loads config.json and the safetensors checkpoint of `dir`.
  static std::unique_ptr<DeepseekV3Model> load(const std::string& dir, ops::Backend& backend);

  const ModelConfig& config() const { return c_; }
  ops::Backend& backend() const { return be_; }
  // A pool of `num_blocks` blocks of `block_size` tokens on this model's backend.
  LatentKvPool new_pool(int64_t num_blocks, int64_t block_size) const;
  SequenceCache new_cache(int64_t capacity, int64_t block_size = 64) const;

  // One step over a batch: writes the new tokens' latent rows to their slots and returns the
  // logits of batch.logit_rows, [logit_rows.size(), vocab], on the host.
  std::vector<float> forward(const ForwardBatch& batch, LatentKvPool& pool, MlaForm form = MlaForm::Auto);

  // Single-sequence convenience: runs `tokens` at positions cache.length.. and appends them.
  // Returns every token's logits when all_logits, else the last token's.
  std::vector<float> forward(const std::vector<int32_t>& tokens, SequenceCache& cache, bool all_logits,
                             MlaForm form = MlaForm::Auto);

 private:
  struct StepInputs;  // the batch's index arrays on the backend
  void attention(int64_t layer, const float* x, float* out, const StepInputs& in, LatentKvPool& pool, MlaForm form);
  void ffn(int64_t layer, const float* x, float* out, int64_t T);

  OwnedTensor scratch(int64_t rows, int64_t cols);

  ModelConfig c_;
  ModelWeights w_;
  ops::Backend& be_;
  OwnedTensor inv_freq_;  // [rope / 2] f32
  float rope_factor_;
  float scale_;
};

}  // namespace kiln
