// Weight bytes, counted tensor by tensor from weight_layout(): how each tensor is stored in a
// given weight format (data + scales), how it is sharded over a parallel layout, and the totals
// the memory and roofline models need.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/weight_layout.h"

namespace kiln::plan {

enum class WeightFormat : uint8_t {
  Bf16,          // every tensor bf16
  Fp8,           // 2-D projections e4m3 + one fp32 scale per 128x128 block (DeepSeek-V3 / Kimi K2 FP8);
                 // embedding, lm_head, router and norms bf16
  Int4Experts,   // routed experts int4 + one bf16 scale per 32 inputs (Kimi K2 Thinking); rest bf16
  Mxfp4Experts,  // routed experts fp4 e2m1 + one 8-bit e8m0 scale per 32 inputs (OCP MXFP4); rest bf16
};

const char* weight_format_name(WeightFormat f);
// Accepts bf16, fp8, int4, mxfp4 (case-insensitive); an unknown name is an error naming --weights.
WeightFormat parse_weight_format(const std::string& s);

struct TensorBytes {
  int64_t data = 0;   // quantised or plain values
  int64_t scale = 0;  // block / group scales
  int64_t total() const { return data + scale; }
};
// Block and group sizes of the quantized formats: a checkpoint's own (its quantization_config),
// else what the published checkpoints use.
struct QuantGeometry {
  int64_t fp8_block_n = 128, fp8_block_k = 128;  // DeepSeek-V3 weight_block_size
  int64_t int4_group = 32;                       // Kimi K2-Thinking group_size
};
QuantGeometry quant_geometry(const ModelConfig& c);
// Storage of one tensor in format `f`.
TensorBytes tensor_bytes(const WeightSpec& w, WeightFormat f, const QuantGeometry& g = {});

// How a tensor is split over the GPUs of a layout.
enum class Shard : uint8_t {
  Replicated,   // every GPU holds it: norms, router, q_a_proj / kv_a_proj_with_mqa (they feed all heads)
  AttentionTp,  // split over the attention TP group: q/kv_b/o projections by head, dense and shared MLP
                // by intermediate dim, embedding and lm_head by vocabulary
  World,        // routed experts: EP x expert-TP covers every GPU
};
Shard shard_of(const WeightSpec& w);

// What the tensor's compute runs on, for the tensor-rate side of the roofline.
enum class MatmulKind : uint8_t {
  None,    // norms, biases, embedding lookup: no matmul FLOPs worth counting
  Group,   // applied to every token of the attention-DP group (attention, dense MLP, shared, router)
  Logits,  // lm_head: only rows that are sampled
  Expert,  // a routed expert: a token passes through k of E
};
MatmulKind matmul_kind(const WeightSpec& w);

struct WeightTotals {
  int64_t params = 0;                      // counted tensors (NextN layers only with include_mtp)
  int64_t bytes = 0;                       // whole model once (data + scales)
  int64_t scale_bytes = 0;                 // of which scales
  std::array<int64_t, 9> bytes_by_role{};  // indexed by WeightRole
  double bytes_per_gpu = 0;                // one GPU's share: replicated + AttentionTp/tp + World/world
  double replicated_bytes_per_gpu = 0;     // of which replicated
  // Roofline inputs, per GPU.
  double static_read_bytes_per_gpu = 0;    // read every step whatever the batch: all but routed experts
                                           // and the embedding table (a lookup reads B rows)
  double expert_bytes_all_layers = 0;      // one routed expert summed over the MoE layers, unsharded
  double group_matmul_params_per_gpu = 0;  // MatmulKind::Group params one GPU applies per group token
  double logits_params_per_gpu = 0;        // lm_head params per GPU
  double expert_params_all_layers = 0;     // one routed expert over all MoE layers (params)
  int64_t moe_layers = 0;
  // What Kiln holds beyond the checkpoint's bytes, per GPU (model/weights.h): W_uk^T, the absorbed
  // form's transpose of kv_b's k rows (plain bf16), and scale grids stacked with one row per weight
  // row where a fused part (gate over up, q over kv_a, a head of kv_b) ends inside a block.
  double loaded_extra_bytes_per_gpu = 0;
};

// Totals for `c` in format `f` on a layout with attention-TP size `tp` and `world` GPUs.
WeightTotals weight_totals(const ModelConfig& c, WeightFormat f, int64_t tp, int64_t world, bool include_mtp);

}  // namespace kiln::plan
