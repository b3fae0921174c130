// Model weights on a backend, loaded from a checkpoint and checked against weight_layout().
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"
#include "ops/backend.h"

namespace kiln {

using ops::OwnedTensor;

struct LayerWeights {
  OwnedTensor input_norm, post_attn_norm;  // [hidden]
  // Attention. Both projections of the normalised input in one matrix, so one linear serves them:
  // qkv_a [qkv_a_q_rows + kv_lora + rope, hidden] = q_a_proj (q LoRA) or q_proj, then
  // kv_a_proj_with_mqa, stacked row-wise at load time. q LoRA adds q_a_norm [q_lora] and
  // q_b [heads*qk, q_lora].
  OwnedTensor qkv_a, q_a_norm, q_b;
  OwnedTensor kv_a_norm;  // [kv_lora]
  OwnedTensor kv_b;       // [heads * (nope + v), kv_lora]: per head, nope rows (W_uk) then v rows (W_uv)
  OwnedTensor w_uk_t;     // [heads, kv_lora, nope]: W_uk transposed per head, for the absorbed form
  OwnedTensor o_proj;     // [hidden, heads * v]
  // FFN: dense layers use mlp_*; MoE layers use shared_* (when n_shared_experts > 0) and experts_*.
  bool moe = false;
  OwnedTensor mlp_gate_up, mlp_down;        // [2 * inter, hidden], [hidden, inter]
  OwnedTensor shared_gate_up, shared_down;  // [2 * moe_inter * n_shared, hidden], [hidden, ...]
  OwnedTensor router, router_bias;          // [experts, hidden] f32, [experts] f32
  OwnedTensor experts_gate_up;              // [experts, 2 * moe_inter, hidden]
  OwnedTensor experts_down;                 // [experts, hidden, moe_inter]
};

// The rows of qkv_a that project q: q_lora_rank with q LoRA, else heads * qk (q_proj).
inline int64_t qkv_a_q_rows(const ModelConfig& c) {
  return c.q_lora_rank > 0 ? c.q_lora_rank : c.num_attention_heads * c.qk_head_dim();
}

struct ModelWeights {
  OwnedTensor embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  OwnedTensor final_norm;  // [hidden]
  OwnedTensor lm_head;     // [vocab, hidden] (the embedding when tied)
};

// Loads every main-model tensor (NextN layers are checked but not loaded). A missing, unexpected
// or mis-shaped tensor is an error naming the file, the tensor and both shapes. FP8 block-scaled
// weights are dequantised with their weight_scale_inv.
ModelWeights load_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be);

// Random weights of the right shapes, filled on the backend itself (no host round trip for the
// experts), for benchmarks of shapes we have no checkpoint for. Projections are uniform with unit
// output variance, norms are 1, router biases 0; W_uk is the true transpose of kv_b's rows, so the
// two MLA forms still agree.
ModelWeights random_weights(const ModelConfig& c, ops::Backend& be, uint64_t seed);

}  // namespace kiln
