// The tensors a DeepSeek-V3 family checkpoint holds for a config: names as the published
// checkpoints spell them, shapes, and what each is for. The loader checks a checkpoint against this
// list; model-info and the planner count parameters and bytes from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace kiln {

enum class WeightRole : uint8_t {
  Embedding,     // model.embed_tokens
  LmHead,        // lm_head (absent when tied)
  Norm,          // every RMSNorm weight
  Attention,     // q/kv projections, kv_b_proj, o_proj
  DenseMlp,      // the first_k_dense_replace layers' MLP
  Router,        // mlp.gate.weight and its e_score_correction_bias
  RoutedExpert,  // mlp.experts.{e}.*
  SharedExpert,  // mlp.shared_experts.*
  Mtp,           // the NextN/MTP layers' own tensors (enorm, hnorm, eh_proj, shared_head, embed)
};

const char* weight_role_name(WeightRole r);

struct WeightSpec {
  std::string name;
  Shape shape;
  WeightRole role;
  int64_t layer = -1;   // decoder layer (-1 for embedding, final norm, lm_head)
  int64_t expert = -1;  // routed expert index
  bool matrix = false;  // a 2-D projection weight: FP8 checkpoints store it quantised with a scale
  bool mtp = false;     // belongs to a NextN layer (layer index >= num_hidden_layers)

  int64_t numel() const { return shape_numel(shape); }
};

// Every tensor of the model, main layers first, then the NextN layers when
// num_nextn_predict_layers > 0 (as DeepSeek-V3 lays them out, `model.layers.{L + i}.*`).
std::vector<WeightSpec> weight_layout(const ModelConfig& c);

struct ParamCounts {
  int64_t total = 0;   // main model (NextN layers excluded)
  int64_t active = 0;  // per token: everything but the routed experts a token does not use
  int64_t mtp = 0;     // NextN layers
  int64_t routed_expert = 0;
  int64_t embedding = 0;  // embed_tokens + lm_head
};
ParamCounts count_params(const ModelConfig& c);

// Bytes of latent KV cache per token across all main layers at `bytes_per_value`; 1 means the FP8
// cache (core/kv_fp8.h: e4m3 c_kv, its f32 scales and bf16 k_pe: 656 B a layer at kv_lora 512).
int64_t kv_bytes_per_token(const ModelConfig& c, int64_t bytes_per_value = 2);

}  // namespace kiln
