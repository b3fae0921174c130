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
  // Attention. q LoRA: q_a [q_lora, hidden], q_a_norm [q_lora], q_b [heads*qk, q_lora];
  // otherwise q_proj [heads*qk, hidden].
  OwnedTensor q_a, q_a_norm, q_b, q_proj;
  OwnedTensor kv_a;       // [kv_lora + rope, hidden]
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
