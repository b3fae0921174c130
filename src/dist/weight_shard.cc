#include "dist/weight_shard.h"

#include "core/error.h"

namespace kiln::dist {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

WeightShard rows(Range r) {
  return {true, 0, r};
}
WeightShard cols(Range r) {
  return {true, 1, r};
}
Range scaled(Range r, int64_t k) {
  return {r.begin * k, r.end * k};
}

}  // namespace

WeightShard weight_shard(const WeightSpec& w, const ModelConfig& m, const ParallelLayout& layout, int rank) {
  const RankShare s = layout.share(rank);
  const std::string& n = w.name;
  switch (w.role) {
    case WeightRole::Embedding:
    case WeightRole::LmHead: return rows(s.vocab);
    case WeightRole::Attention:
      if (ends_with(n, "self_attn.q_b_proj.weight") || ends_with(n, "self_attn.q_proj.weight"))
        return rows(scaled(s.heads, m.qk_head_dim()));
      if (ends_with(n, "self_attn.kv_b_proj.weight")) return rows(scaled(s.heads, m.qk_nope_head_dim + m.v_head_dim));
      if (ends_with(n, "self_attn.o_proj.weight")) return cols(scaled(s.heads, m.v_head_dim));
      return {};  // q_a_proj, kv_a_proj_with_mqa: the latent down-projections stay whole
    case WeightRole::DenseMlp: return ends_with(n, "down_proj.weight") ? cols(s.dense_inter) : rows(s.dense_inter);
    case WeightRole::SharedExpert:
      return ends_with(n, "down_proj.weight") ? cols(s.shared_inter) : rows(s.shared_inter);
    case WeightRole::RoutedExpert: {
      if (!s.experts.contains(w.expert)) return {false, -1, {}};
      if (s.expert_inter.size() == m.moe_intermediate_size) return {};
      return ends_with(n, "down_proj.weight") ? cols(s.expert_inter) : rows(s.expert_inter);
    }
    case WeightRole::Mtp:
      // The NextN layer's own vocabulary tables split like the main ones; its norms and eh_proj stay whole.
      if (ends_with(n, "embed_tokens.weight") || ends_with(n, "shared_head.head.weight")) return rows(s.vocab);
      return {};
    case WeightRole::Norm:
    case WeightRole::Router: return {};
  }
  return {};
}

int64_t shard_numel(const WeightSpec& w, const WeightShard& s) {
  if (!s.held) return 0;
  if (s.dim < 0) return w.numel();
  KILN_CHECK(static_cast<size_t>(s.dim) < w.shape.size(), "weight {}: a shard along dim {} of a {}-d tensor", w.name,
             s.dim, w.shape.size());
  return w.numel() / w.shape[s.dim] * s.range.size();
}

Range scale_range(Range r, int64_t block) {
  KILN_CHECK(block >= 1, "scale block {}: needs at least 1", block);
  if (r.size() <= 0) return {r.begin / block, r.begin / block};
  return {r.begin / block, (r.end + block - 1) / block};
}

}  // namespace kiln::dist
