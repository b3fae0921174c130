// Model weights on a backend, loaded from a checkpoint and checked against weight_layout().
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"
#include "ops/backend.h"

namespace kiln {

using ops::OwnedTensor;

// A projection as loaded: plain values (t.dtype: the backend's weight dtype), or quantized codes
// (t.dtype F8E4M3: [n, k]; I4X8: [n, ceil(k / 8)] words of eight int4; experts [E, ...]) with their
// scale grid (ops/params.h WeightScales; docs/quantization.md).
struct Weight : OwnedTensor {
  OwnedTensor scale;  // [ceil(n / block_n), ceil(k / block_k)] F32 or BF16 (experts: [E, ...]); empty: plain
  int64_t block_n = 0, block_k = 0;

  Weight() = default;
  Weight(OwnedTensor plain) : OwnedTensor(std::move(plain)) {}  // NOLINT: a plain weight converts
  bool quantized() const { return scale.mem != nullptr; }
  ops::WeightScales scales() const {
    return quantized() ? ops::WeightScales{scale.t.data, scale.t.dtype, block_n, block_k} : ops::WeightScales{};
  }
};

struct LayerWeights {
  OwnedTensor input_norm, post_attn_norm;  // [hidden]
  // Attention. Both projections of the normalised input in one matrix, so one linear serves them:
  // qkv_a [qkv_a_q_rows + kv_lora + rope, hidden] = q_a_proj (q LoRA) or q_proj, then
  // kv_a_proj_with_mqa, stacked row-wise at load time. q LoRA adds q_a_norm [q_lora] and
  // q_b [heads*qk, q_lora].
  Weight qkv_a, q_b;
  OwnedTensor q_a_norm;
  OwnedTensor kv_a_norm;  // [kv_lora]
  // [heads * (nope + v), kv_lora]: per head, nope rows (W_uk) then v rows (W_uv). Quantized, its
  // scale rows start on every head's W_uv (block_n divides nope and nope + v, else block_n is 1).
  Weight kv_b;
  OwnedTensor w_uk_t;  // [heads, kv_lora, nope]: W_uk transposed per head, for the absorbed form; always
                       // plain (dequantized at load from a quantized kv_b)
  Weight o_proj;       // [hidden, heads * v]
  // FFN: dense layers use mlp_*; MoE layers use shared_* (when n_shared_experts > 0) and experts_*.
  bool moe = false;
  Weight mlp_gate_up, mlp_down;        // [2 * inter, hidden], [hidden, inter]
  Weight shared_gate_up, shared_down;  // [2 * moe_inter * n_shared, hidden], [hidden, ...]
  OwnedTensor router, router_bias;     // [experts, hidden] f32, [experts] f32 (never quantized)
  Weight experts_gate_up;              // [experts, 2 * moe_inter, hidden]
  Weight experts_down;                 // [experts, hidden, moe_inter]
};

// The rows of qkv_a that project q: q_lora_rank with q LoRA, else heads * qk (q_proj).
inline int64_t qkv_a_q_rows(const ModelConfig& c) {
  return c.q_lora_rank > 0 ? c.q_lora_rank : c.num_attention_heads * c.qk_head_dim();
}

// The embedding, lm_head, router and norms are never quantized in the published checkpoints and
// stay plain.
struct ModelWeights {
  OwnedTensor embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  OwnedTensor final_norm;  // [hidden]
  OwnedTensor lm_head;     // [vocab, hidden] (the embedding when tied)
};

// How projections are stored: as the checkpoint ships them, or block-quantized to FP8 at load.
enum class WeightQuant : uint8_t {
  None,         // plain (random weights) / as shipped (checkpoints)
  Fp8,          // e4m3 with one f32 scale per 128 x 128 block: every projection but lm_head (DeepSeek-V3)
  Int4Experts,  // routed experts int4, one bf16 scale per 32 inputs; the rest plain (Kimi K2-Thinking)
};
// "none", "fp8", "int4"; anything else is an error naming `flag`.
WeightQuant parse_weight_quant(const std::string& s, const std::string& flag);

// Loads every main-model tensor (NextN layers are checked but not loaded). A missing, unexpected
// or mis-shaped tensor is an error naming the file, the tensor and both shapes. FP8 block-scaled
// (weight + weight_scale_inv) and compressed-tensors INT4 (weight_packed + weight_scale +
// weight_shape) projections stay quantized; `quant` Fp8 block-quantizes a plain checkpoint's
// projections as a DeepSeek-V3 FP8 checkpoint ships them (a quantized checkpoint is an error).
ModelWeights load_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be,
                          WeightQuant quant = WeightQuant::None);

// One NextN / MTP layer (DeepSeek-V3's `model.layers.{num_hidden_layers + i}.*`): its own copies
// of the embedding and head, the norms of its two inputs, the projection of their concatenation,
// and a full decoder layer.
struct MtpWeights {
  OwnedTensor embed;         // [vocab, hidden]
  OwnedTensor enorm, hnorm;  // [hidden] each: the next token's embedding, the target's hidden state
  Weight eh_proj;            // [hidden, 2 * hidden]: input columns [enorm(embed) ; hnorm(h)]
  LayerWeights layer;        // the decoder layer (MLA + MoE or dense, as is_moe_layer says)
  OwnedTensor head_norm;     // [hidden]: shared_head.norm
  OwnedTensor head;          // [vocab, hidden]: shared_head.head
};
// Loads NextN layer `index` (< num_nextn_predict_layers) of the checkpoint.
MtpWeights load_mtp_weights(const ModelConfig& c, const Checkpoint& ckpt, ops::Backend& be, int64_t index = 0);

// W_uk transposed per head out of kv_b's f32 values [heads * (nope + v), r]: [heads, r, nope], the
// absorbed form's fold.
std::vector<float> w_uk_transpose(const std::vector<float>& kv_b, int64_t heads, int64_t nope, int64_t v, int64_t r);

// Random weights of the right shapes, filled on the backend itself (no host round trip for the
// experts), for benchmarks of shapes we have no checkpoint for. Projections are uniform with unit
// output variance, norms are 1, router biases 0; W_uk is the true transpose of kv_b's rows, so the
// two MLA forms still agree.
// `quant` stores them as that format would (codes and scales of the same output scale).
ModelWeights random_weights(const ModelConfig& c, ops::Backend& be, uint64_t seed,
                            WeightQuant quant = WeightQuant::None);

}  // namespace kiln
