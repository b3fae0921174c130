#include "plan/weight_bytes.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace kiln::plan {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Bf16: return "bf16";
    case WeightFormat::Fp8: return "fp8";
    case WeightFormat::Int4Experts: return "int4";
    case WeightFormat::Mxfp4Experts: return "mxfp4";
  }
  return "?";
}

WeightFormat parse_weight_format(const std::string& s) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (l == "bf16") return WeightFormat::Bf16;
  if (l == "fp8" || l == "fp8-e4m3") return WeightFormat::Fp8;
  if (l == "int4" || l == "int4-experts" || l == "w4a16") return WeightFormat::Int4Experts;
  if (l == "mxfp4" || l == "fp4" || l == "mxfp4-experts") return WeightFormat::Mxfp4Experts;
  fail("--weights {}: unknown weight format (bf16, fp8, int4, mxfp4)", s);
}

QuantGeometry quant_geometry(const ModelConfig& c) {
  QuantGeometry g;
  if (c.fp8) g.fp8_block_n = c.fp8->block_n, g.fp8_block_k = c.fp8->block_k;
  if (c.int4) g.int4_group = c.int4->group_size;
  return g;
}

TensorBytes tensor_bytes(const WeightSpec& w, WeightFormat f, const QuantGeometry& g) {
  const int64_t n = w.numel();
  // e_score_correction_bias is kept in fp32 by the published checkpoints; everything else that is
  // not quantised is bf16.
  if (ends_with(w.name, "e_score_correction_bias")) return {n * 4, 0};
  const bool two_d = w.shape.size() == 2;
  const int64_t rows = two_d ? w.shape[0] : 0, cols = two_d ? w.shape[1] : 0;
  switch (f) {
    case WeightFormat::Bf16: break;
    case WeightFormat::Fp8:
      // The published FP8 checkpoints keep lm_head in bf16 although it is a projection.
      if (w.matrix && two_d && w.role != WeightRole::LmHead)
        return {n, ceil_div(rows, g.fp8_block_n) * ceil_div(cols, g.fp8_block_k) * 4};  // e4m3 + fp32 a block
      break;
    case WeightFormat::Int4Experts:
      if (w.role == WeightRole::RoutedExpert && two_d)
        return {ceil_div(n, 2), rows * ceil_div(cols, g.int4_group) * 2};  // two nibbles a byte + bf16 a group
      break;
    case WeightFormat::Mxfp4Experts:
      if (w.role == WeightRole::RoutedExpert && two_d)
        return {ceil_div(n, 2), rows * ceil_div(cols, 32)};  // two e2m1 a byte + e8m0 per 32 inputs
      break;
  }
  return {n * 2, 0};
}

Shard shard_of(const WeightSpec& w) {
  switch (w.role) {
    case WeightRole::RoutedExpert: return Shard::World;
    case WeightRole::Norm:
    case WeightRole::Router: return Shard::Replicated;
    case WeightRole::Attention:
      // The down-projections to the latent feed every head, so each TP rank keeps a full copy.
      if (ends_with(w.name, "q_a_proj.weight") || ends_with(w.name, "kv_a_proj_with_mqa.weight"))
        return Shard::Replicated;
      return Shard::AttentionTp;
    case WeightRole::Mtp:
      // NextN's own tensors: its embedding and head split by vocabulary, the rest is small.
      if (ends_with(w.name, "embed_tokens.weight") || ends_with(w.name, "shared_head.head.weight"))
        return Shard::AttentionTp;
      return Shard::Replicated;
    case WeightRole::Embedding:
    case WeightRole::LmHead:
    case WeightRole::DenseMlp:
    case WeightRole::SharedExpert: return Shard::AttentionTp;
  }
  return Shard::Replicated;
}

MatmulKind matmul_kind(const WeightSpec& w) {
  if (w.shape.size() != 2 || ends_with(w.name, "embed_tokens.weight")) return MatmulKind::None;
  if (w.role == WeightRole::RoutedExpert) return MatmulKind::Expert;
  if (w.role == WeightRole::LmHead || ends_with(w.name, "shared_head.head.weight")) return MatmulKind::Logits;
  return MatmulKind::Group;
}

namespace {

// Extra f32 scale rows when a stacked FP8 weight's part of `rows` rows ends inside a block: the
// whole stack then keeps one scale row per weight row (model/host_weight.h concat_rows).
int64_t unit_rows_extra(int64_t first_rows, int64_t total_rows, int64_t cols, const QuantGeometry& g) {
  if (first_rows % g.fp8_block_n == 0) return 0;
  const int64_t gk = ceil_div(cols, g.fp8_block_k);
  return (total_rows - ceil_div(first_rows, g.fp8_block_n) - ceil_div(total_rows - first_rows, g.fp8_block_n)) * gk * 4;
}

// Per layer: the bytes Kiln holds beyond the checkpoint's, split as they shard (replicated, by head /
// TP, routed experts over the world).
struct LayerExtra {
  double replicated = 0, tp = 0, world = 0;
};

LayerExtra layer_extra(const ModelConfig& c, int64_t l, WeightFormat f, const QuantGeometry& g) {
  LayerExtra e;
  const int64_t nh = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim, r = c.kv_lora_rank;
  e.tp += static_cast<double>(nh * r * nope * 2);  // W_uk^T in bf16
  if (f != WeightFormat::Fp8) return e;
  const int64_t H = c.hidden_size;
  const int64_t q_rows = c.q_lora_rank > 0 ? c.q_lora_rank : nh * c.qk_head_dim();
  e.replicated += static_cast<double>(unit_rows_extra(q_rows, q_rows + c.kv_row_dim(), H, g));
  if (nope % g.fp8_block_n != 0 || vd % g.fp8_block_n != 0) {
    const int64_t rows = nh * (nope + vd), gk = ceil_div(r, g.fp8_block_k);
    e.tp += static_cast<double>((rows - ceil_div(rows, g.fp8_block_n)) * gk * 4);
  }
  if (!c.is_moe_layer(l)) {
    e.tp += static_cast<double>(unit_rows_extra(c.intermediate_size, 2 * c.intermediate_size, H, g));
    return e;
  }
  const int64_t I = c.moe_intermediate_size;
  e.world += static_cast<double>(c.n_routed_experts * unit_rows_extra(I, 2 * I, H, g));
  if (c.n_shared_experts > 0) {
    const int64_t S = I * c.n_shared_experts;
    e.tp += static_cast<double>(unit_rows_extra(S, 2 * S, H, g));
  }
  return e;
}

}  // namespace

WeightTotals weight_totals(const ModelConfig& c, WeightFormat f, int64_t tp, int64_t world, bool include_mtp) {
  KILN_CHECK(tp > 0 && world > 0 && world % tp == 0, "attention TP {} must divide the {} GPUs", tp, world);
  WeightTotals t;
  const QuantGeometry g = quant_geometry(c);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerExtra e = layer_extra(c, l, f, g);
    t.loaded_extra_bytes_per_gpu +=
        e.replicated + e.tp / static_cast<double>(tp) + e.world / static_cast<double>(world);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) t.moe_layers += c.is_moe_layer(l) ? 1 : 0;
  const double per_expert = c.n_routed_experts > 0 ? 1.0 / static_cast<double>(c.n_routed_experts) : 0.0;
  for (const auto& w : weight_layout(c)) {
    if (w.mtp && !include_mtp) continue;
    const TensorBytes b = tensor_bytes(w, f, g);
    t.params += w.numel();
    t.bytes += b.total();
    t.scale_bytes += b.scale;
    t.bytes_by_role[static_cast<size_t>(w.role)] += b.total();
    const Shard s = shard_of(w);
    const double div = s == Shard::Replicated ? 1.0 : static_cast<double>(s == Shard::World ? world : tp);
    const double gpu_bytes = static_cast<double>(b.total()) / div;
    const double gpu_params = static_cast<double>(w.numel()) / div;
    t.bytes_per_gpu += gpu_bytes;
    if (s == Shard::Replicated) t.replicated_bytes_per_gpu += gpu_bytes;
    switch (matmul_kind(w)) {
      case MatmulKind::Expert:
        // Every expert has the same shape, so one expert's share is the routed total / E.
        t.expert_bytes_all_layers += static_cast<double>(b.total()) * per_expert;
        t.expert_params_all_layers += static_cast<double>(w.numel()) * per_expert;
        break;
      case MatmulKind::Group:
        t.static_read_bytes_per_gpu += gpu_bytes;
        t.group_matmul_params_per_gpu += gpu_params;
        break;
      case MatmulKind::Logits:
        t.static_read_bytes_per_gpu += gpu_bytes;
        t.logits_params_per_gpu += gpu_params;
        break;
      case MatmulKind::None:
        if (!ends_with(w.name, "embed_tokens.weight")) t.static_read_bytes_per_gpu += gpu_bytes;
        break;
    }
  }
  return t;
}

}  // namespace kiln::plan
