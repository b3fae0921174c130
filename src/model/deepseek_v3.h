// The DeepSeek-V3 forward, written once against the op interface (DESIGN.md §4). A sequence keeps
// its latent KV cache: one row of kv_lora + rope values (normalised c_kv ‖ roped k_pe) per token
// per layer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace kiln {

// Which MLA form attention runs in.
enum class MlaForm { Auto, Expanded, Absorbed };  // Auto: expanded for prompts, absorbed for 1 token

struct SequenceCache {
  std::vector<OwnedTensor> layers;  // per layer [capacity, kv_lora + rope]
  int64_t capacity = 0;
  int64_t length = 0;  // tokens already cached
};

class DeepseekV3Model {
 public:
  DeepseekV3Model(ModelConfig config, ModelWeights weights, ops::Backend& backend);
  // Loads config.json and the safetensors checkpoint of `dir`.
  static std::unique_ptr<DeepseekV3Model> load(const std::string& dir, ops::Backend& backend);

  const ModelConfig& config() const { return c_; }
  SequenceCache new_cache(int64_t capacity) const;

  // Runs `tokens` at positions cache.length.. and appends them to the cache. Returns logits
  // [num_rows, vocab] on the host: every token's row when all_logits, else the last token's.
  std::vector<float> forward(const std::vector<int32_t>& tokens, SequenceCache& cache, bool all_logits,
                             MlaForm form = MlaForm::Auto);

 private:
  void attention(int64_t layer, const float* x, float* out, int64_t T, SequenceCache& cache, MlaForm form,
                 const int32_t* positions);
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
