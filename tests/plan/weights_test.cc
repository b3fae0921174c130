// Weight bytes tensor by tensor: each format's storage rule, totals that add up, and sharding.
#include <gtest/gtest.h>

#include "core/error.h"
#include "plan/presets.h"
#include "plan/weight_bytes.h"

namespace kiln::plan {
namespace {

WeightSpec spec(const std::string& name, Shape shape, WeightRole role, bool matrix) {
  WeightSpec w;
  w.name = name;
  w.shape = std::move(shape);
  w.role = role;
  w.matrix = matrix;
  return w;
}

TEST(WeightBytes, StorageRulesPerFormat) {
  // A routed expert's gate_proj of Kimi K2: [2048, 7168].
  const WeightSpec e =
      spec("model.layers.3.mlp.experts.0.gate_proj.weight", {2048, 7168}, WeightRole::RoutedExpert, true);
  const int64_t n = 2048LL * 7168;
  EXPECT_EQ(tensor_bytes(e, WeightFormat::Bf16).total(), 2 * n);
  // FP8: one byte a value + an fp32 scale per 128x128 block (16 x 56 blocks).
  EXPECT_EQ(tensor_bytes(e, WeightFormat::Fp8).data, n);
  EXPECT_EQ(tensor_bytes(e, WeightFormat::Fp8).scale, 16 * 56 * 4);
  // int4: half a byte a value + a bf16 scale per 32 inputs (7168 / 32 = 224 per row).
  EXPECT_EQ(tensor_bytes(e, WeightFormat::Int4Experts).data, n / 2);
  EXPECT_EQ(tensor_bytes(e, WeightFormat::Int4Experts).scale, 2048 * 224 * 2);
  EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(tensor_bytes(e, WeightFormat::Int4Experts).total()) / n, 4.5);
  // MXFP4: an 8-bit scale per 32 -> 4.25 bits.
  EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(tensor_bytes(e, WeightFormat::Mxfp4Experts).total()) / n, 4.25);
  // Ragged blocks round up.
  const WeightSpec odd = spec("x.o_proj.weight", {130, 129}, WeightRole::Attention, true);
  EXPECT_EQ(tensor_bytes(odd, WeightFormat::Fp8).scale, 2 * 2 * 4);

  // int4 / mxfp4 touch routed experts only: attention, shared experts and lm_head stay bf16.
  const WeightSpec attn = spec("model.layers.0.self_attn.o_proj.weight", {7168, 8192}, WeightRole::Attention, true);
  const WeightSpec shared =
      spec("model.layers.3.mlp.shared_experts.up_proj.weight", {2048, 7168}, WeightRole::SharedExpert, true);
  const WeightSpec head = spec("lm_head.weight", {163840, 7168}, WeightRole::LmHead, true);
  for (const WeightSpec* w : {&attn, &shared, &head}) {
    EXPECT_EQ(tensor_bytes(*w, WeightFormat::Int4Experts).total(), 2 * w->numel()) << w->name;
    EXPECT_EQ(tensor_bytes(*w, WeightFormat::Mxfp4Experts).total(), 2 * w->numel()) << w->name;
  }
  // FP8 checkpoints quantise projections but keep lm_head, norms and the router bias as published.
  EXPECT_EQ(tensor_bytes(attn, WeightFormat::Fp8).data, attn.numel());
  EXPECT_EQ(tensor_bytes(head, WeightFormat::Fp8).total(), 2 * head.numel());
  const WeightSpec bias = spec("model.layers.3.mlp.gate.e_score_correction_bias", {384}, WeightRole::Router, false);
  EXPECT_EQ(tensor_bytes(bias, WeightFormat::Fp8).total(), 384 * 4);
}

TEST(WeightBytes, TotalsAddUpAndShard) {
  const ModelConfig& c = find_preset("kimi-k2")->config;
  for (WeightFormat f : {WeightFormat::Bf16, WeightFormat::Fp8, WeightFormat::Int4Experts}) {
    SCOPED_TRACE(weight_format_name(f));
    const WeightTotals one = weight_totals(c, f, 1, 1, false);
    int64_t by_role = 0;
    for (int64_t b : one.bytes_by_role) by_role += b;
    EXPECT_EQ(by_role, one.bytes);
    EXPECT_EQ(one.params, count_params(c).total);
    EXPECT_NEAR(one.bytes_per_gpu, static_cast<double>(one.bytes), 1.0);
    // Over 8 GPUs every tensor is split 8 ways except the replicated ones.
    const WeightTotals eight = weight_totals(c, f, 8, 8, false);
    EXPECT_NEAR(eight.bytes_per_gpu * 8 - 7 * eight.replicated_bytes_per_gpu, static_cast<double>(one.bytes),
                1e-6 * static_cast<double>(one.bytes));
    EXPECT_GT(eight.replicated_bytes_per_gpu, 0);
  }
  // Kimi K2 Thinking ships int4 experts in about 594 GB; the bf16 model is about 2.05 TB.
  EXPECT_NEAR(static_cast<double>(weight_totals(c, WeightFormat::Int4Experts, 1, 1, false).bytes), 594.2e9, 1e9);
  EXPECT_NEAR(static_cast<double>(weight_totals(c, WeightFormat::Bf16, 1, 1, false).bytes), 2052.8e9, 1e9);
}

// A checkpoint's own block and group sizes set its scale bytes, and what Kiln holds beyond the
// checkpoint (model/weights.h) is counted apart: W_uk^T (bf16) always, and one f32 scale row per
// weight row for stacked FP8 weights whose first part ends inside a block.
TEST(WeightBytes, QuantGeometryAndLoadedExtras) {
  ModelConfig c = find_preset("deepseek-v3")->config;
  const int64_t w_uk_t = c.num_hidden_layers * c.num_attention_heads * c.kv_lora_rank * c.qk_nope_head_dim * 2;
  // DeepSeek-V3's widths are multiples of 128: only W_uk^T is extra.
  EXPECT_DOUBLE_EQ(weight_totals(c, WeightFormat::Fp8, 1, 1, false).loaded_extra_bytes_per_gpu,
                   static_cast<double>(w_uk_t));
  EXPECT_NEAR(weight_totals(c, WeightFormat::Bf16, 8, 8, false).loaded_extra_bytes_per_gpu, w_uk_t / 8.0, 1.0);
  const WeightSpec e =
      spec("model.layers.3.mlp.experts.0.down_proj.weight", {7168, 2048}, WeightRole::RoutedExpert, true);
  c.fp8 = Fp8Quant{64, 32};
  EXPECT_EQ(tensor_bytes(e, WeightFormat::Fp8, quant_geometry(c)).scale, 112 * 64 * 4);
  c.int4 = Int4Quant{128, {}};
  EXPECT_EQ(tensor_bytes(e, WeightFormat::Int4Experts, quant_geometry(c)).scale, 7168 * 16 * 2);
  // moe_intermediate_size 2000 ends inside a 128-row block: gate|up keeps 4000 scale rows, not 16 + 16.
  ModelConfig odd = find_preset("deepseek-v3")->config;
  odd.moe_intermediate_size = 2000;
  const int64_t moe_layers = odd.num_hidden_layers - odd.first_k_dense_replace;
  const int64_t per_fused = (4000 - 2 * 16) * 56 * 4;  // 7168 / 128 = 56 scale columns
  EXPECT_DOUBLE_EQ(weight_totals(odd, WeightFormat::Fp8, 1, 1, false).loaded_extra_bytes_per_gpu,
                   static_cast<double>(w_uk_t + moe_layers * (odd.n_routed_experts + 1) * per_fused));
}

TEST(WeightBytes, MtpCountsOnlyWhenAsked) {
  const ModelConfig& c = find_preset("deepseek-v3")->config;
  const WeightTotals main = weight_totals(c, WeightFormat::Fp8, 8, 8, false);
  const WeightTotals with = weight_totals(c, WeightFormat::Fp8, 8, 8, true);
  EXPECT_EQ(main.params, count_params(c).total);
  EXPECT_EQ(with.params, count_params(c).total + count_params(c).mtp);
  EXPECT_GT(with.bytes, main.bytes);
}

TEST(WeightBytes, FormatNames) {
  EXPECT_EQ(parse_weight_format("INT4"), WeightFormat::Int4Experts);
  EXPECT_EQ(parse_weight_format("fp8"), WeightFormat::Fp8);
  EXPECT_EQ(parse_weight_format("mxfp4"), WeightFormat::Mxfp4Experts);
  EXPECT_THROW(parse_weight_format("int3"), Error);
}

}  // namespace
}  // namespace kiln::plan
